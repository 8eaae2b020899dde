"""minipd's own CPU kernels: the C++ sources (int8 matmuls over GGUF's blocks, the fused decode
step, the float32 prefill attention and row ops), their build with g++ at first use into one
cached library per instruction set (`vnni_kernels`), and the CPU's feature flags (`cpu_flags`).

It knows no model: which modules call the ops, and with what, is `weights` (the matmuls) and
`kernel_steps` (a model's decode step and prefill ops). The sources ship as package data.
"""
