"""Instance picking on its own, without processes: prefill by prefix overlap then queue load,
decode by running requests then free blocks; dead, excluded and wrong-role instances are never
picked; incompatible instances are refused."""

from __future__ import annotations

import asyncio

import pytest

from minipd.control.messages import PROTOCOL_VERSION, Fingerprint, Stats, Welcome
from minipd.control.role import Role
from minipd.models.arch.model_config import PRESETS
from minipd.router.registry import IncompatibleInstance, InstanceHandle, InstanceRegistry

BS = 16
FINGERPRINT = Fingerprint(PROTOCOL_VERSION, PRESETS["tiny"], "digest", "float32", BS, "layout")


class FakeChannel:
    def __init__(self) -> None:
        self.closed = asyncio.Event()


def handle(
    instance_id: str, role: Role, free: int = 100, running: int = 0, fingerprint: Fingerprint = FINGERPRINT
) -> InstanceHandle:
    welcome = Welcome(instance_id=instance_id, role=role, fingerprint=fingerprint, max_num_seqs=8)
    h = InstanceHandle(welcome, FakeChannel(), ("127.0.0.1", 0))
    h.stats = Stats(
        instance_id=instance_id,
        role=role,
        num_running=running,
        num_waiting=0,
        num_free_blocks=free,
        num_used_blocks=100 - free,
        num_cached_blocks=0,
        num_blocks=100,
    )
    return h


def registry(*handles: InstanceHandle) -> InstanceRegistry:
    r = InstanceRegistry()
    for h in handles:
        r.add(h)
    return r


PROMPT = list(range(5 * BS))


def test_prefill_prefers_the_instance_holding_the_longest_prefix():
    a, b = handle("p-a", Role.PREFILL), handle("p-b", Role.PREFILL)
    r = registry(a, b)
    hashes = r.prompt_hashes(PROMPT)
    b.remember_prefix(hashes[:3], capacity=100)
    a.remember_prefix(hashes[:1], capacity=100)
    choice = r.pick_prefill(hashes)
    assert choice.instance is b and choice.num_cached_tokens == 3 * BS


def test_prefill_load_outweighs_a_short_prefix_and_ties_go_to_the_less_busy():
    a, b = handle("p-a", Role.PREFILL), handle("p-b", Role.PREFILL)
    r = registry(a, b)
    hashes = r.prompt_hashes(PROMPT)
    a.remember_prefix(hashes[:1], capacity=100)  # a saves BS tokens of compute...
    with a.counted(num_prompt_tokens=4 * BS):  # ...but has 4 * BS tokens queued already
        assert r.pick_prefill(hashes).instance is b
    with b.counted():  # equal queued tokens: fewer requests in flight wins
        assert r.pick_prefill(r.prompt_hashes([9] * BS)).instance is a
    assert (a.num_inflight, a.num_inflight_tokens, b.num_inflight) == (0, 0, 0)


def test_remembered_prefixes_are_capped_and_the_oldest_forgotten_first():
    a = handle("p-a", Role.PREFILL)
    r = registry(a)
    old, new = r.prompt_hashes(PROMPT), r.prompt_hashes(list(range(1000, 1000 + 5 * BS)))
    a.remember_prefix(old, capacity=5)
    a.remember_prefix(new, capacity=5)
    assert a.prefix_overlap(new) == 5 and a.prefix_overlap(old) == 0


def test_decode_prefers_fewer_running_then_more_free_blocks_and_counts_in_flight_requests():
    busy = handle("d-busy", Role.DECODE, free=90, running=3)
    full = handle("d-full", Role.DECODE, free=10, running=1)
    roomy = handle("d-roomy", Role.DECODE, free=80, running=1)
    r = registry(busy, full, roomy)
    assert r.pick_decode() is roomy
    with roomy.counted(), roomy.counted():  # two routed there since its last stats
        assert r.pick_decode() is full


def test_dead_excluded_and_wrong_role_instances_are_never_picked():
    prefill, decode, colocated = handle("p", Role.PREFILL), handle("d", Role.DECODE), handle("c", Role.BOTH)
    r = registry(prefill, decode, colocated)
    assert {h.instance_id for h in r.decode_candidates()} == {"d", "c"}
    assert [h.instance_id for h in r.prefill_candidates()] == ["p"]  # a colocated one prefills only for itself
    decode.channel.closed.set()
    assert r.pick_decode() is colocated
    assert r.pick_decode(exclude={"c"}) is None
    prefill.channel.closed.set()
    assert r.pick_prefill(r.prompt_hashes(PROMPT)).instance is None


def test_an_incompatible_or_duplicate_instance_is_refused_naming_the_difference():
    r = registry(handle("d", Role.DECODE))
    other = Fingerprint(PROTOCOL_VERSION, PRESETS["small"], "digest", "float32", BS, "layout")
    with pytest.raises(IncompatibleInstance, match="hidden_size"):
        r.add(handle("d2", Role.DECODE, fingerprint=other))
    with pytest.raises(IncompatibleInstance, match="already registered"):
        r.add(handle("d", Role.DECODE))
