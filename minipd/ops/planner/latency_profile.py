"""`LatencyProfile`: everything the simulator needs to know about one instance, as JSON.

A profile is measured (`python bench.py profile`), derived from a roofline
(`minipd.ops.planner.profiles`) or calibrated to published figures; `source` says which, and
the fields below say what it was measured on, so a plan always names its assumptions.
"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from minipd.ops.planner.latency_model import (
    DecodeModel,
    DecodeSample,
    FitStats,
    PrefillModel,
    PrefillSample,
)


class LatencyProfile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    model: str
    dtype: str
    device: str
    threads: int | None = None  # torch threads of a CPU measurement; None when not measured on a CPU
    tensor_parallel: int = 1  # GPUs per instance
    num_layers: int  # for the layer-wise overlap of the KV transfer
    kv_bytes_per_token: int
    kv_capacity_tokens: int  # KV the instance holds, in tokens
    max_batched_tokens: int  # the engine's token budget per step
    max_num_seqs: int  # sequences per step
    prefill: PrefillModel
    decode: DecodeModel
    prefill_fit: FitStats | None = None
    decode_fit: FitStats | None = None
    link_gbps: float = math.inf  # KV link bandwidth out of a prefill instance, Gbit/s
    link_setup_s: float = 0.0  # fixed cost of one KV transfer
    source: str = "measured"  # "measured", "roofline" or "calibrated"
    notes: str = ""
    prefill_samples: list[PrefillSample] | None = None  # what a measured profile was fitted to
    decode_samples: list[DecodeSample] | None = None

    def __post_init__(self) -> None:
        for part in ("prefill", "decode"):
            model = getattr(self, part)
            for coef in ("a", "b", "c"):
                value = getattr(model, coef)
                if not (math.isfinite(value) and value >= 0):
                    raise ValueError(f"{part}.{coef}: must be finite and >= 0, got {value}")
        for field in (
            "num_layers",
            "kv_bytes_per_token",
            "kv_capacity_tokens",
            "max_batched_tokens",
            "max_num_seqs",
            "tensor_parallel",
        ):
            if getattr(self, field) < 1:
                raise ValueError(f"{field}: must be >= 1, got {getattr(self, field)}")
        if not self.link_gbps > 0:
            raise ValueError(f"link_gbps: must be positive, got {self.link_gbps}")
        if not (math.isfinite(self.link_setup_s) and self.link_setup_s >= 0):
            raise ValueError(f"link_setup_s: must be finite and >= 0, got {self.link_setup_s}")

    def replace(self, **changes) -> LatencyProfile:
        return msgspec.structs.replace(self, **changes)

    def to_json(self) -> bytes:
        # JSON has no infinity: an unlimited link is written as null.
        data = msgspec.to_builtins(self)
        if math.isinf(self.link_gbps):
            data["link_gbps"] = None
        return msgspec.json.format(msgspec.json.encode(data), indent=2)

    @classmethod
    def from_json(cls, text: bytes | str) -> LatencyProfile:
        try:
            data = msgspec.json.decode(text)
            if isinstance(data, dict) and data.get("link_gbps", 0) is None:
                data["link_gbps"] = math.inf
            return msgspec.convert(data, cls)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise ValueError(f"latency profile: {exc}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> LatencyProfile:
        return cls.from_json(Path(path).read_bytes())
