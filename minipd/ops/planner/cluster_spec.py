"""How many instances of each role a simulated cluster starts with, and how they are run."""

from __future__ import annotations

import math

import msgspec

from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.step_jitter import SpeedTrace, StepJitter
from minipd.policy.local_prefill import LocalPrefillThresholds


class ClusterSpec(msgspec.Struct, frozen=True):
    """Either all colocated (`num_colocated` > 0, no prefill or decode instances) or
    disaggregated (`num_decode` >= 1, any number of prefill instances; with none, every
    prompt is prefilled on decode)."""

    num_prefill: int = 0
    num_decode: int = 0
    num_colocated: int = 0

    def __post_init__(self) -> None:
        for field in ("num_prefill", "num_decode", "num_colocated"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field}: must be >= 0, got {getattr(self, field)}")
        if self.num_colocated and (self.num_prefill or self.num_decode):
            raise ValueError("cluster: colocated instances cannot be mixed with prefill/decode instances")
        if not self.num_colocated and not self.num_decode:
            raise ValueError("cluster: needs at least one decode or colocated instance")

    @classmethod
    def colocated(cls, n: int) -> ClusterSpec:
        return cls(num_colocated=n)

    @classmethod
    def split(cls, num_prefill: int, num_decode: int) -> ClusterSpec:
        return cls(num_prefill=num_prefill, num_decode=num_decode)

    @property
    def size(self) -> int:
        return self.num_prefill + self.num_decode + self.num_colocated

    @property
    def label(self) -> str:
        if self.num_colocated:
            return f"colocated x{self.num_colocated}"
        return f"{self.num_prefill}P:{self.num_decode}D"


COLOCATED_SCHEDULING = ("chunked", "prefill-first")


class SimOptions(msgspec.Struct, frozen=True, kw_only=True):
    link: KVLink | None = None  # None: the profile's link, layer-wise
    local_prefill: LocalPrefillThresholds = LocalPrefillThresholds()
    max_batched_tokens: int | None = None  # prefill and decode instances; None: the profile's
    colocated_batched_tokens: int | None = None  # colocated instances' chunk budget; None: the profile's
    # "chunked": minipd's engine (decodes plus prefill chunks in one step); "prefill-first":
    # vLLM's original scheduler, whole prompts in steps of their own (DistServe's baseline)
    colocated_scheduling: str = "chunked"
    switch_delay_s: float = 0.0  # a drained instance's downtime before it serves in its new role
    control_interval_s: float = 1.0  # how often a controller is asked
    # A request's fixed latency outside the instances' steps (the HTTP front, tokenization,
    # the router's hop and control calls, the first token's relay back): it reaches admission
    # this long after it arrives, and its TTFT counts from its arrival.
    request_overhead_s: float = 0.0
    # A disaggregated request's hop from its first token to its decode instance's batch (the
    # router passing the token on, the decode instance taking the request in): it joins the
    # batch this long after its KV has landed, which is when its first token counts.
    decode_join_delay_s: float = 0.0
    # Step-time jitter (step_jitter.py) of prefill instances, and of decode and colocated
    # ones; None: every step takes exactly the profile's time.
    prefill_jitter: StepJitter | None = None
    decode_jitter: StepJitter | None = None
    # A measured speed per instance (step_jitter.SpeedTrace), instead of either jitter.
    speed_trace: SpeedTrace | None = None

    def __post_init__(self) -> None:
        for field in ("max_batched_tokens", "colocated_batched_tokens"):
            value = getattr(self, field)
            if value is not None and value < 1:
                raise ValueError(f"{field}: must be >= 1, got {value}")
        if self.colocated_scheduling not in COLOCATED_SCHEDULING:
            raise ValueError(
                f"colocated_scheduling: expected one of {COLOCATED_SCHEDULING}, got {self.colocated_scheduling!r}"
            )
        if self.switch_delay_s < 0:
            raise ValueError(f"switch_delay_s: must be >= 0, got {self.switch_delay_s}")
        for field in ("request_overhead_s", "decode_join_delay_s"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{field}: must be finite and >= 0, got {value}")
        if self.speed_trace is not None and (self.prefill_jitter or self.decode_jitter):
            raise ValueError("speed_trace: replaces prefill_jitter and decode_jitter; give one or the other")
        if not self.control_interval_s > 0:
            raise ValueError(f"control_interval_s: must be positive, got {self.control_interval_s}")
