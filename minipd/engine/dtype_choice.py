"""`--dtype auto`: bfloat16 where the device multiplies bf16 natively, float32 elsewhere.

bf16 halves the bytes every decode step streams and, where the hardware has bf16 dot
products, runs the matmuls faster too (2.3-2.8x on an AVX512-BF16 CPU for SmolLM2's
shapes); without them torch emulates bf16 and is slower than float32. So "auto" picks:

- CUDA: bfloat16 on compute capability 8.0 (Ampere) and newer, float32 before it;
- CPU: bfloat16 when the CPU flags (Linux `/proc/cpuinfo`) list AVX512-BF16 or AMX-BF16,
  float32 otherwise (and where the flags cannot be read).

`resolve_dtype` turns the configured name into a concrete one before anything depends on
it (the model, the KV pool, the compatibility fingerprint), so two instances started with
"auto" on the same machine agree, and the choice comes with a reason for the start-up line.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

import torch

from minipd.engine.kv_pool import DTYPES
from minipd.models.kernels.cpu_flags import read_cpu_flags

AUTO = "auto"
DTYPE_CHOICES = (AUTO, *sorted(DTYPES))
BF16, FP32 = "bfloat16", "float32"
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # Linux names of the x86 bf16 dot-product extensions
MIN_CUDA_BF16_CAPABILITY = (8, 0)


class DtypeChoice(NamedTuple):
    name: str  # a key of kv_pool.DTYPES
    reason: str

    def describe(self) -> str:
        return f"dtype {self.name} ({self.reason})"


def choose_auto_dtype(
    device_type: str, cpu_flags: Iterable[str] | None, cuda_capability: tuple[int, int] | None = None
) -> DtypeChoice:
    """The "auto" choice from the facts alone (pure, so it can be tested with fake flags)."""
    if device_type == "cuda":
        if cuda_capability is not None and tuple(cuda_capability) >= MIN_CUDA_BF16_CAPABILITY:
            return DtypeChoice(
                BF16, f"auto: CUDA compute capability {cuda_capability[0]}.{cuda_capability[1]} has native bf16 matmuls"
            )
        return DtypeChoice(
            FP32,
            f"auto: CUDA compute capability {cuda_capability} is below "
            f"{MIN_CUDA_BF16_CAPABILITY[0]}.{MIN_CUDA_BF16_CAPABILITY[1]}, no native bf16",
        )
    if device_type != "cpu":
        return DtypeChoice(FP32, f"auto: no bf16 rule for device type {device_type!r}")
    if cpu_flags is None:
        return DtypeChoice(FP32, "auto: the CPU flags could not be read, so bf16 support is unknown")
    found = [flag for flag in BF16_CPU_FLAGS if flag in set(cpu_flags)]
    if found:
        return DtypeChoice(BF16, f"auto: the CPU has native bf16 matmuls ({', '.join(found)})")
    return DtypeChoice(FP32, f"auto: the CPU lacks {' and '.join(BF16_CPU_FLAGS)}, so bf16 would be emulated")


def resolve_dtype(name: str, device: str) -> DtypeChoice:
    """The concrete dtype for the configured `name` on `device`; ValueError names a bad one."""
    if name != AUTO:
        if name not in DTYPES:
            raise ValueError(f"dtype: unknown {name!r}; choose one of {list(DTYPE_CHOICES)}")
        return DtypeChoice(name, "as configured")
    torch_device = torch.device(device)
    if torch_device.type == "cuda":
        return choose_auto_dtype("cuda", None, torch.cuda.get_device_capability(torch_device))
    return choose_auto_dtype(torch_device.type, read_cpu_flags())
