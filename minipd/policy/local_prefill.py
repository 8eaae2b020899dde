"""Conditional disaggregation: prefill this prompt on its decode instance, or send it to prefill?

A pure decision function, called by the simulator and meant for the live router too. Two
reasons to keep a prompt local, after Dynamo's conditional-disaggregation policies:

1. *short* (Dynamo's `isl_bounding`): the part of the prompt the decode instance does not
   hold in its prefix cache is at most `max_local_tokens`. Sending it would cost a queue
   wait, a transfer and a hop for a chunk the decode step absorbs almost for free. minipd's
   router applies this rule today (`local_prefill_max_tokens`, at or below).
2. *prefill busy* (Dynamo's `prefill_load`): the least-loaded prefill instance already has
   more than `prefill_busy_tokens` tokens (or `prefill_busy_requests` prompts) queued, so
   the prompt would wait there anyway, and the decode instance has room: after admitting
   the request its KV use stays at or below `decode_max_kv_fraction` of capacity and it
   runs fewer than `decode_max_running` sequences (Dynamo's decode-busy veto).
With no prefill instance at all, every prompt is local.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import msgspec


class Placement(enum.Enum):
    REMOTE = "remote"  # prefill instance, KV over the link
    LOCAL_SHORT = "local-short"  # rule 1
    LOCAL_PREFILL_BUSY = "local-prefill-busy"  # rule 2
    LOCAL_NO_PREFILL = "local-no-prefill"  # no prefill instance to send it to

    @property
    def is_local(self) -> bool:
        return self is not Placement.REMOTE

    @property
    def decision(self) -> str:
        """Its name where operators read it (`minipd_disagg_decisions_total{decision}`, the
        router's spans): why the prompt went where it did, not the enum's name."""
        return _DECISIONS[self]


_DECISIONS = {
    Placement.REMOTE: "remote_prefill",
    Placement.LOCAL_SHORT: "local_prefill_size",
    Placement.LOCAL_PREFILL_BUSY: "local_prefill_load",
    Placement.LOCAL_NO_PREFILL: "local_prefill_no_prefill_instance",
}


class LocalPrefillThresholds(msgspec.Struct, frozen=True):
    max_local_tokens: int = 16  # rule 1; 0 turns it off (a prompt has at least one uncached token)
    prefill_busy_tokens: int | None = None  # rule 2 on queued tokens per prefill instance; None: off
    prefill_busy_requests: int | None = None  # rule 2 on queued prompts per prefill instance; None: off
    decode_max_kv_fraction: float = 0.9
    decode_max_running: int | None = None  # None: the decode instance's max_num_seqs

    def __post_init__(self) -> None:
        if self.max_local_tokens < 0:
            raise ValueError(f"max_local_tokens: must be >= 0, got {self.max_local_tokens}")
        for field in ("prefill_busy_tokens", "prefill_busy_requests", "decode_max_running"):
            value = getattr(self, field)
            if value is not None and value < 0:
                raise ValueError(f"{field}: must be >= 0 or None, got {value}")
        if not 0 < self.decode_max_kv_fraction <= 1:
            raise ValueError(f"decode_max_kv_fraction: must be in (0, 1], got {self.decode_max_kv_fraction}")


class PlacementInput(NamedTuple):
    uncached_tokens: int  # prompt tokens the decode instance would have to compute
    prefill_queue_tokens: int  # queued on the least-loaded prefill instance
    prefill_queue_requests: int
    num_prefill_instances: int  # able to take work now
    decode_kv_free_tokens: int  # before this request is admitted
    decode_kv_capacity_tokens: int
    request_kv_tokens: int  # what this request needs on decode (prompt + output)
    decode_running: int  # sequences running or about to run there
    decode_max_num_seqs: int


def place_prefill(state: PlacementInput, thresholds: LocalPrefillThresholds) -> Placement:
    if state.num_prefill_instances == 0:
        return Placement.LOCAL_NO_PREFILL
    if state.uncached_tokens <= thresholds.max_local_tokens:
        return Placement.LOCAL_SHORT
    busy = (
        thresholds.prefill_busy_tokens is not None and state.prefill_queue_tokens > thresholds.prefill_busy_tokens
    ) or (
        thresholds.prefill_busy_requests is not None and state.prefill_queue_requests > thresholds.prefill_busy_requests
    )
    if busy:
        used_after = state.decode_kv_capacity_tokens - state.decode_kv_free_tokens + state.request_kv_tokens
        max_running = thresholds.decode_max_running
        if max_running is None:
            max_running = state.decode_max_num_seqs
        if (
            used_after <= thresholds.decode_max_kv_fraction * state.decode_kv_capacity_tokens
            and state.decode_running < max_running
        ):
            return Placement.LOCAL_PREFILL_BUSY
    return Placement.REMOTE
