"""A model's steps run by minipd's C++ kernels instead of torch's eager ops: a whole decode step
in one call (`fused_decode`) and a prefill chunk's attention, norms and SiLU (`prefill_kernels`).
Each prepares a model's arguments once, or says why it cannot serve that model.

The kernels' sources and build are in `kernels`; the eager forward they stand in for is `arch.llama`.
"""
