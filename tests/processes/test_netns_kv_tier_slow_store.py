"""A slow store costs computing, within the tier's bound, never a request: a process cluster on
`tiny` (router, one prefill and one decode process) shares a KV tier on a real redis-server
that runs on a host of its own, a network namespace reached over a veth (store_host.py).

Turn 1 of a conversation is stored while the link is fast; then the store is slowed, either by
`tc qdisc add dev eth0 root netem delay 3000ms` on its end of the veth (every reply 3 s late:
a lookup and a fetch, unbounded, would take 6 s) or by SIGSTOP (it never answers). Turn 2,
whose sixth block the tier has (tier_conversation.py), is then served, computed, within the
tier's call bound (2 s) and a slack, with no tier hit: the lookup is counted as a timeout on
/metrics, and every pool is back to full once the stores under way gave their blocks back.
Once the delay is removed (the store resumed), conversations get tier hits again. Everything
created (the namespace, its veth, the qdisc, the server) is removed whatever happens.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import time

import pytest
from http_helpers import scrape, serving, start_cluster, wait_until_pools_full
from kvtier_stores import ALWAYS_FETCH, redis_missing
from netns_hosts import unavailable_reason
from redis_server import RedisServer, running_redis
from store_host import StoreHost, netem_missing
from tier_conversation import STORED_BLOCKS, TURN1_TOKENS, complete, reference_answer, turn_one, turn_two

REASON = unavailable_reason() or redis_missing()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

DELAY_MS = 3000
TIER_BOUND_S = 2.0  # TierSettings.timeout_s: every call of the tier returns within it
SLACK_S = 2.5  # the prompt computed after the lookup gave up, on a busy machine; under 2 delayed replies
RESUME_TIMEOUT_S = 90.0
STORE_WAIT_S = 10.0
SETTLE_S = 60.0


@pytest.fixture(scope="module")
def store():
    """(the store's host, the redis-server running there)."""
    with StoreHost() as host:
        spawn = functools.partial(host.spawn, "store")
        with running_redis(host=host.store_address, spawn=spawn) as redis:
            yield host, redis


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, store):
    """The router's base URL."""
    flags = ("--model", "tiny", "--dtype", "float32", "--kv-tier", store[1].url, *ALWAYS_FETCH)
    with serving(start_cluster(tmp_path_factory.mktemp("slow-store"), *flags)) as base_url:
        yield base_url


def tier_total(base_url: str, name: str, **labels: str) -> float:
    """`name` summed over the instances on /metrics (with these labels)."""
    return sum(
        v
        for (sample, sample_labels), v in scrape(base_url).items()
        if sample == name and set(labels.items()) <= sample_labels
    )


def wait_until(condition, timeout_s: float) -> bool:
    """Poll `condition` until it holds or `timeout_s` passes; whether it held."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)  # poll interval of a bounded wait
    return True


def tier_hits(base_url: str) -> float:
    return tier_total(base_url, "minipd_kv_tier_hit_tokens_total", source="tier")


def hits_resume(base_url: str, redis: RedisServer, reference, seed: int) -> bool:
    """Conversations until one's second turn gets tier hits, within RESUME_TIMEOUT_S (the first
    stores after the store came back may fail on connections it left behind: those turns are
    not stored, and the next conversation is tried)."""
    deadline = time.monotonic() + RESUME_TIMEOUT_S
    while time.monotonic() < deadline:
        seed += 1
        keys = redis.dbsize()
        first = complete(base_url, [random.Random(seed).randrange(256) for _ in range(TURN1_TOKENS)])
        if not wait_until(lambda keys=keys: redis.dbsize() >= keys + STORED_BLOCKS, STORE_WAIT_S):
            continue
        before = tier_hits(base_url)
        turn_two(base_url, first, reference, seed)
        if wait_until(lambda before=before: tier_hits(base_url) > before, STORE_WAIT_S):
            return True
    return False


@pytest.mark.timeout(600)
@pytest.mark.parametrize("slowing", ["netem", "sigstop"])
def test_a_slow_store_costs_computing_within_the_bound_and_hits_resume(
    cluster, store, make_engine, loop_thread, slowing
):
    host, redis = store
    if slowing == "netem" and (missing := netem_missing()) is not None:
        pytest.skip(missing)
    reference = reference_answer(make_engine, loop_thread)
    seed = {"netem": 100, "sigstop": 200}[slowing]
    base = cluster
    first, _ = turn_one(base, redis, seed)
    wait_until_pools_full(base, timeout=SETTLE_S)
    hits, timeouts = tier_hits(base), tier_total(base, "minipd_kv_tier_timeouts_total")

    if slowing == "netem":
        host.delay(DELAY_MS)
        assert f"delay {DELAY_MS / 1000:g}s" in host.qdiscs() or f"delay {DELAY_MS}ms" in host.qdiscs()
    else:
        os.kill(redis.process.pid, signal.SIGSTOP)
    try:
        second = turn_two(base, first, reference, seed)
        assert second.elapsed_s < TIER_BOUND_S + SLACK_S, second.elapsed_s
        wait_until_pools_full(base, timeout=SETTLE_S)  # the stores under way gave their blocks back
        assert wait_until(lambda: tier_total(base, "minipd_kv_tier_timeouts_total") > timeouts, SETTLE_S)
        assert tier_hits(base) == hits  # computed: nothing came from the tier
    finally:
        if slowing == "netem":
            host.undelay()
        else:
            os.kill(redis.process.pid, signal.SIGCONT)
    if slowing == "netem":
        assert "netem" not in host.qdiscs()
    assert hits_resume(base, redis, reference, seed)
    wait_until_pools_full(base, timeout=SETTLE_S)
