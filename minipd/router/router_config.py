"""The router's settings (flags `--local-prefill-max-tokens`, `--kv-wait-s`, ...; entrypoints/flags.py)
and their checks; the local-prefill policy's thresholds are derived from them."""

from __future__ import annotations

import msgspec

from minipd.control.channel import DEFAULT_LIVENESS_TIMEOUT_S
from minipd.engine.kv_admission import DEFAULT_KV_ADMISSION_RATIO, validate_ratio
from minipd.policy.local_prefill import LocalPrefillThresholds

KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")


class RouterConfig(msgspec.Struct, frozen=True, kw_only=True):
    local_prefill_max_tokens: int = 16  # uncached prompt tokens at or below which decode prefills itself
    # the prefill pool is the bottleneck when its least-loaded instance has more than this
    # many prompt tokens (or prompts) queued; a prompt then runs on decode if decode has room
    prefill_busy_tokens: int | None = None  # None: rule off
    prefill_busy_requests: int | None = None
    decode_room_kv_fraction: float = 0.9  # decode has room: KV use after admission at most this
    decode_room_max_running: int | None = None  # and fewer sequences than this (None: its max_num_seqs)
    layerwise: bool = True  # stream KV per layer during prefill, or send it all afterwards
    call_timeout_s: float = 120.0
    # accept a request while the KV claims of live requests fit in this many times the decode
    # instances' blocks (engine/kv_admission.py); None or 0: no limit
    kv_admission_ratio: float | None = DEFAULT_KV_ADMISSION_RATIO
    kv_wait_s: float = 30.0  # longest a request waits for room in a decode pool before it fails as overloaded
    liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S  # an instance silent this long is declared dead; 0: off
    inter_token_timeout_s: float = 60.0  # a relayed stream with no output for this long fails
    kv_load_failure: str = "recompute"  # the KV did not arrive: "recompute" on the decode instance, or "fail"
    stats_timeout_s: float = 1.0  # one stats poll of one instance
    # a request whose decode instance is lost mid-stream goes on elsewhere this many times at
    # most (router/migration.py); 0: it fails naming the instance
    migration_limit: int = 0

    def validate(self) -> None:
        validate_ratio(self.kv_admission_ratio)
        for field in ("call_timeout_s", "inter_token_timeout_s", "stats_timeout_s", "kv_wait_s"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field}: must be positive, got {getattr(self, field)!r}")
        if not isinstance(self.migration_limit, int) or self.migration_limit < 0:
            raise ValueError(f"migration_limit: must be an integer >= 0 (0: off), got {self.migration_limit!r}")
        if self.liveness_timeout_s < 0:
            raise ValueError(f"liveness_timeout_s: must be >= 0 (0 disables it), got {self.liveness_timeout_s}")
        if self.kv_load_failure not in KV_LOAD_FAILURE_POLICIES:
            raise ValueError(
                f"kv_load_failure: expected one of {list(KV_LOAD_FAILURE_POLICIES)}, got {self.kv_load_failure!r}"
            )

    def __post_init__(self) -> None:
        for field in ("prefill_busy_tokens", "prefill_busy_requests", "decode_room_max_running"):
            value = getattr(self, field)
            if value is not None and value < 0:
                raise ValueError(f"{field}: must be >= 0, got {value}")
        if not 0 < self.decode_room_kv_fraction <= 1:
            raise ValueError(f"decode_room_kv_fraction: must be in (0, 1], got {self.decode_room_kv_fraction}")

    @property
    def local_prefill(self) -> LocalPrefillThresholds:
        """The placement policy's thresholds (a negative local_prefill_max_tokens turns rule 1 off)."""
        return LocalPrefillThresholds(
            max_local_tokens=max(0, self.local_prefill_max_tokens),
            prefill_busy_tokens=self.prefill_busy_tokens,
            prefill_busy_requests=self.prefill_busy_requests,
            decode_max_kv_fraction=self.decode_room_kv_fraction,
            decode_max_running=self.decode_room_max_running,
        )
