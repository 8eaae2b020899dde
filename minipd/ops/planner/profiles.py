"""Built-in latency profiles for setups far larger than this machine, from a roofline.

Hardware (vendor datasheets, dense 16-bit tensor throughput, i.e. without 2:4 sparsity):
- A100 SXM4 80GB: 312 TFLOP/s BF16, 2,039 GB/s HBM2e, NVLink 600 GB/s (300 per direction)
  (NVIDIA A100 Tensor Core GPU datasheet).
- H100 SXM5 80GB: 989 TFLOP/s BF16 (1,979 with sparsity), 3.35 TB/s HBM3, NVLink 900 GB/s
  (450 per direction) (NVIDIA H100 Tensor Core GPU datasheet).
- H200 SXM 141GB: 989 TFLOP/s BF16, 4.8 TB/s HBM3e, NVLink 900 GB/s (NVIDIA H200 datasheet).
- KV link: one 400 Gb/s ConnectX-7 (NDR InfiniBand) NIC per GPU, as in DGX/HGX H100 and
  H200 systems (ConnectX-7 datasheet); an instance of TP GPUs sends over TP NICs. The A100
  figure assumes one 200 Gb/s ConnectX-6 (HDR) per GPU, as in DGX A100.

Models (the published Hugging Face config.json of each): Llama-3-8B (32 layers, hidden 4096,
MLP 14336, 32 heads, 8 KV heads, head_dim 128, vocab 128256) and Llama-3-70B (80 layers,
hidden 8192, MLP 28672, 64 heads, 8 KV heads); OPT-13B (40 layers, hidden 5120, MLP 20480
ungated, 40 heads, no GQA, vocab 50272), the 13B model of DistServe's evaluation.

Efficiency factors, overheads and memory reserve are the `Efficiency` defaults in
`roofline.py` (assumptions, stated there). The engine limits follow vLLM's defaults: a
token budget of 8192 per step and 256 sequences.

`distserve-13b-a100` is different: calibrated to DistServe's published figures on top of the
A100 roofline. See `distserve_example`.
"""

from __future__ import annotations

from collections.abc import Callable

from minipd.ops.planner.hardware import H100, H200, LLAMA3_8B, LLAMA3_70B
from minipd.ops.planner.latency_profile import LatencyProfile
from minipd.ops.planner.roofline import roofline_profile


def _distserve_profile() -> LatencyProfile:
    from minipd.ops.planner.experiments import distserve_example  # the calibration experiment defines it

    return distserve_example.profile()


BUILTIN: dict[str, Callable[[], LatencyProfile]] = {
    "llama3-8b-h100": lambda: roofline_profile("llama3-8b-h100", LLAMA3_8B, H100),
    "llama3-8b-h200": lambda: roofline_profile("llama3-8b-h200", LLAMA3_8B, H200),
    "llama3-70b-h100-tp4": lambda: roofline_profile("llama3-70b-h100-tp4", LLAMA3_70B, H100, tensor_parallel=4),
    "llama3-70b-h200-tp4": lambda: roofline_profile("llama3-70b-h200-tp4", LLAMA3_70B, H200, tensor_parallel=4),
    "llama3-70b-h200-tp2": lambda: roofline_profile("llama3-70b-h200-tp2", LLAMA3_70B, H200, tensor_parallel=2),
    "distserve-13b-a100": _distserve_profile,
}


def builtin_profile(name: str) -> LatencyProfile:
    try:
        return BUILTIN[name]()
    except KeyError:
        raise ValueError(f"builtin profile: unknown {name!r}; choose one of {sorted(BUILTIN)}") from None
