"""What an engine is built from (`EngineConfig`) and what it reports (`EngineStats`).

`EngineConfig.validate` names the first bad field in its ValueError; the engine calls it
before loading anything. The batching limits live in its `scheduler` (a `SchedulerConfig`,
their one definition); `EngineConfig.of(max_num_seqs=..., block_size=...)` and
`config.replace(...)` take the flat field names of both, so call sites stay one line.
"""

from __future__ import annotations

from typing import Any

import msgspec
import torch

from minipd.engine import cpu_placement
from minipd.engine.block_manager import BlockUsage
from minipd.engine.dtype_choice import AUTO, DTYPE_CHOICES
from minipd.engine.scheduler import SchedulerConfig

SCHEDULER_FIELDS = frozenset(SchedulerConfig.__struct_fields__)
WEIGHTS_CHOICES = (AUTO, "quantized", "mixed", "dense")  # --weights; see model_loader.load_model
QUANTIZED_KERNEL_CHOICES = (AUTO, "vnni", "avx2", "torch")  # --quantized-kernel; see quantized_linear.choose_kernel


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    model: str = "tiny"  # preset, packaged model (smollm2), .gguf file or Hugging Face-format directory
    device: str = "cpu"
    dtype: str = AUTO  # or float32, bfloat16, float16; the engine resolves "auto" (see dtype_choice.py)
    # A GGUF's 4-bit tensors: "quantized" (multiplied as stored), "mixed" (so, plus a dense copy
    # for prefill chunks) or "dense" (dequantized to dtype); the engine resolves "auto" to mixed in
    # bfloat16 and quantized in float32 where it can (see gguf_loader.auto_weights).
    weights: str = AUTO
    # What multiplies quantized weights: "vnni" or "avx2" (minipd's int8 dot-product kernels for
    # AVX-512 VNNI or AVX2 CPUs), "torch" (torch's int4 kernel) or "auto" (the first of vnni, avx2
    # that runs, else torch); the model says which it got.
    quantized_kernel: str = AUTO
    block_size: int = 16
    num_blocks: int = 1024
    scheduler: SchedulerConfig = SchedulerConfig()
    enable_prefix_caching: bool = True
    # Decode rows through the fused decode step where the model allows it (every projection and
    # the lm_head in GGUF's blocks, float32 or bfloat16: models/kernel_steps/fused_decode.py); off: eager torch ops.
    fused_decode: bool = True
    # Eager steps' norms, SiLU and prefill attention through minipd's float32 kernels where the
    # model allows it (float32 on the CPU, weights multiplied by minipd's int8 kernels:
    # models/kernel_steps/prefill_kernels.py); off: torch's ops and SDPA.
    prefill_kernels: bool = True
    # The compute thread's OpenMP team size and cores (see cpu_placement.py). None: one core
    # of the CPU set left to the event loop, not pinned; without cpu_placement, torch's choice.
    torch_threads: int | None = None
    cpus: tuple[int, ...] | None = None
    cpu_placement: bool = True
    step_log: str | None = None  # a file to append a JSON line per step to (step_log.py)

    @classmethod
    def of(cls, **fields: Any) -> "EngineConfig":
        """An EngineConfig from flat field names, the `SchedulerConfig` ones included."""
        return cls().replace(**fields)

    def replace(self, **fields: Any) -> "EngineConfig":
        """A copy with `fields` changed; `SchedulerConfig` field names change `scheduler`."""
        limits = {name: fields.pop(name) for name in SCHEDULER_FIELDS if name in fields}
        if limits:
            fields["scheduler"] = msgspec.structs.replace(fields.get("scheduler", self.scheduler), **limits)
        return msgspec.structs.replace(self, **fields)

    def validate(self) -> None:
        for field in ("block_size", "num_blocks"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field}: must be positive, got {getattr(self, field)}")
        self.scheduler.validate()
        if self.num_blocks * self.block_size < self.scheduler.max_model_len:
            raise ValueError(
                f"num_blocks * block_size ({self.num_blocks * self.block_size} tokens) must hold "
                f"max_model_len ({self.scheduler.max_model_len}) tokens"
            )
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device: {self.device!r} requested but CUDA is not available")
        if self.weights not in WEIGHTS_CHOICES:
            raise ValueError(f"weights: unknown {self.weights!r}; choose one of {', '.join(WEIGHTS_CHOICES)}")
        if self.quantized_kernel not in QUANTIZED_KERNEL_CHOICES:
            raise ValueError(
                f"quantized_kernel: unknown {self.quantized_kernel!r}; "
                f"choose one of {', '.join(QUANTIZED_KERNEL_CHOICES)}"
            )
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype: unknown {self.dtype!r}; choose one of {list(DTYPE_CHOICES)}")
        cpu_placement.resolve(self.torch_threads, self.cpus, self.cpu_placement)


class EngineStats(msgspec.Struct):
    num_running: int
    num_waiting: int
    num_preemptions: int  # since start
    blocks: BlockUsage
    num_prefilling: int = 0  # of the running requests, those whose prompt is not all computed yet
