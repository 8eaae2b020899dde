"""The accelerators and model shapes the built-in profiles are computed from: datasheet
figures for the hardware, published architectures for the models (used by `profiles` and
the DistServe calibration experiment)."""

from __future__ import annotations

from minipd.ops.planner.roofline import Accelerator, ModelShape

GB = 1e9
TFLOPS = 1e12

A100 = Accelerator(
    "A100-SXM4-80GB",
    312 * TFLOPS,
    80 * GB,
    2039 * GB,
    300 * GB,
    200.0,
    "NVIDIA A100 datasheet: 312 TFLOP/s BF16 dense, 2.039 TB/s, NVLink 600 GB/s",
)
H100 = Accelerator(
    "H100-SXM5-80GB",
    989 * TFLOPS,
    80 * GB,
    3350 * GB,
    450 * GB,
    400.0,
    "NVIDIA H100 datasheet: 989 TFLOP/s BF16 dense, 3.35 TB/s, NVLink 900 GB/s",
)
H200 = Accelerator(
    "H200-SXM-141GB",
    989 * TFLOPS,
    141 * GB,
    4800 * GB,
    450 * GB,
    400.0,
    "NVIDIA H200 datasheet: 989 TFLOP/s BF16 dense, 4.8 TB/s, NVLink 900 GB/s",
)

LLAMA3_8B = ModelShape(
    "Llama-3-8B",
    num_layers=32,
    hidden_size=4096,
    intermediate_size=14336,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
)
LLAMA3_70B = ModelShape(
    "Llama-3-70B",
    num_layers=80,
    hidden_size=8192,
    intermediate_size=28672,
    num_heads=64,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
)
OPT_13B = ModelShape(
    "OPT-13B",
    num_layers=40,
    hidden_size=5120,
    intermediate_size=20480,
    num_heads=40,
    num_kv_heads=40,
    head_dim=128,
    vocab_size=50272,
    mlp_matrices=2,
    tie_word_embeddings=True,
)
