"""Conditional disaggregation in the router, without processes: the local-prefill policy fed
with fake load (the router's in-flight counts and an instance's last stats)."""

from __future__ import annotations

import asyncio

import pytest

from minipd.control.messages import PROTOCOL_VERSION, Fingerprint, Stats, Welcome
from minipd.control.role import Role
from minipd.models.arch.model_config import PRESETS
from minipd.policy.local_prefill import Placement
from minipd.router.prefill_site import decide_placement
from minipd.router.registry import InstanceHandle
from minipd.router.router_config import RouterConfig

BS = 16
NUM_BLOCKS = 100
MAX_NUM_SEQS = 8
FINGERPRINT = Fingerprint(PROTOCOL_VERSION, PRESETS["tiny"], "digest", "float32", BS, "layout")
LONG = 200  # prompt tokens, far above the isl threshold
MAX_TOKENS = 20


class FakeChannel:
    def __init__(self) -> None:
        self.closed = asyncio.Event()


def handle(instance_id: str, role: Role, free: int = NUM_BLOCKS, running: int = 0) -> InstanceHandle:
    welcome = Welcome(instance_id=instance_id, role=role, fingerprint=FINGERPRINT, max_num_seqs=MAX_NUM_SEQS)
    h = InstanceHandle(welcome, FakeChannel(), ("127.0.0.1", 0))
    h.stats = Stats(
        instance_id=instance_id,
        role=role,
        num_running=running,
        num_waiting=0,
        num_free_blocks=free,
        num_used_blocks=NUM_BLOCKS - free,
        num_cached_blocks=0,
        num_blocks=NUM_BLOCKS,
    )
    return h


def place(decode, pool, config: RouterConfig, uncached: int = LONG, prompt_len: int = LONG) -> Placement:
    return decide_placement(decode, pool, prompt_len, uncached, MAX_TOKENS, BS, config.local_prefill)


BUSY = RouterConfig(prefill_busy_tokens=300)


def test_short_uncached_prompts_stay_local_by_the_old_flag():
    decode, prefill = handle("d", Role.DECODE), handle("p", Role.PREFILL)
    config = RouterConfig(local_prefill_max_tokens=16)
    assert place(decode, [prefill], config, uncached=16) is Placement.LOCAL_SHORT
    assert place(decode, [prefill], config, uncached=17) is Placement.REMOTE
    # a long prompt of which the decode instance caches all but a few tokens is short too
    assert place(decode, [prefill], config, uncached=10, prompt_len=LONG) is Placement.LOCAL_SHORT
    # -1 turns the rule off: even the last token alone goes to prefill
    assert place(decode, [prefill], RouterConfig(local_prefill_max_tokens=-1), uncached=0) is Placement.REMOTE


def test_no_prefill_instance_means_local():
    assert place(handle("d", Role.DECODE), [], RouterConfig()) is Placement.LOCAL_NO_PREFILL


def test_a_busy_prefill_pool_sends_prompts_to_a_decode_instance_with_room():
    decode, prefill = handle("d", Role.DECODE), handle("p", Role.PREFILL)
    assert place(decode, [prefill], BUSY) is Placement.REMOTE  # idle pool
    with prefill.counted(num_prompt_tokens=300):
        assert place(decode, [prefill], BUSY) is Placement.REMOTE  # at the threshold, not above
    with prefill.counted(num_prompt_tokens=301):
        assert place(decode, [prefill], BUSY) is Placement.LOCAL_PREFILL_BUSY
    assert place(decode, [prefill], RouterConfig()) is Placement.REMOTE, "the rule is off by default"


def test_busy_means_the_least_loaded_prefill_instance_is_busy():
    decode, busy, idle = handle("d", Role.DECODE), handle("p-busy", Role.PREFILL), handle("p-idle", Role.PREFILL)
    with busy.counted(num_prompt_tokens=1000):
        assert place(decode, [busy, idle], BUSY) is Placement.REMOTE
        with idle.counted(num_prompt_tokens=400):
            assert place(decode, [busy, idle], BUSY) is Placement.LOCAL_PREFILL_BUSY


def test_queued_prompts_count_too():
    decode, prefill = handle("d", Role.DECODE), handle("p", Role.PREFILL)
    config = RouterConfig(prefill_busy_requests=1)
    with prefill.counted(1), prefill.counted(1):
        assert place(decode, [prefill], config) is Placement.LOCAL_PREFILL_BUSY
    with prefill.counted(1):
        assert place(decode, [prefill], config) is Placement.REMOTE


@pytest.mark.parametrize(
    "free_blocks, running, inflight, expected",
    [
        (NUM_BLOCKS, 0, 0, Placement.LOCAL_PREFILL_BUSY),
        # after admitting 220 tokens (14 blocks) it would hold more than 90% of its pool
        (20, 0, 0, Placement.REMOTE),
        (30, 0, 0, Placement.LOCAL_PREFILL_BUSY),
        # it runs max_num_seqs already, by its stats or by what the router has sent it since
        (NUM_BLOCKS, MAX_NUM_SEQS, 0, Placement.REMOTE),
        (NUM_BLOCKS, 0, MAX_NUM_SEQS, Placement.REMOTE),
        (NUM_BLOCKS, MAX_NUM_SEQS - 1, MAX_NUM_SEQS - 1, Placement.LOCAL_PREFILL_BUSY),
    ],
)
def test_decode_without_room_vetoes_the_busy_rule(free_blocks, running, inflight, expected):
    decode, prefill = handle("d", Role.DECODE, free=free_blocks, running=running), handle("p", Role.PREFILL)
    for _ in range(inflight):
        decode.num_inflight += 1
    with prefill.counted(num_prompt_tokens=1000):
        assert place(decode, [prefill], BUSY) is expected


def test_decode_room_thresholds_are_flags():
    decode, prefill = handle("d", Role.DECODE, free=50, running=2), handle("p", Role.PREFILL)
    with prefill.counted(num_prompt_tokens=1000):
        assert place(decode, [prefill], BUSY) is Placement.LOCAL_PREFILL_BUSY
        tight_kv = RouterConfig(prefill_busy_tokens=300, decode_room_kv_fraction=0.6)
        assert place(decode, [prefill], tight_kv) is Placement.REMOTE
        few_seqs = RouterConfig(prefill_busy_tokens=300, decode_room_max_running=2)
        assert place(decode, [prefill], few_seqs) is Placement.REMOTE


@pytest.mark.parametrize(
    "field, value",
    [
        ("prefill_busy_tokens", -1),
        ("prefill_busy_requests", -2),
        ("decode_room_max_running", -1),
        ("decode_room_kv_fraction", 0.0),
        ("decode_room_kv_fraction", 1.5),
    ],
)
def test_bad_thresholds_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RouterConfig(**{field: value})
