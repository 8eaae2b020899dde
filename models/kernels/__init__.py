"""minipd's own CPU kernels: the C++ sources (int8 matmuls over GGUF's blocks, the fused decode
step, the float32 prefill attention and row ops), their build with g++ into one library per
instruction set (`kernel_build`: at install by setup.py, else at first use), the loading of those
libraries (`vnni_kernels`), and the CPU's feature flags (`cpu_flags`).

It knows no model: which modules call the ops, and with what, is `weights` (the matmuls) and
`kernel_steps` (a model's decode step and prefill ops). The sources ship as package data.
"""
