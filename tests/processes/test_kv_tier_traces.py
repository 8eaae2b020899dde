"""A fetch from the shared KV tier as a span, received by a real OTLP/HTTP endpoint
(otlp_receiver.py): a process cluster on `tiny` (router, one prefill and one decode process)
shares a tier on a real redis-server and exports traces. In a two-turn conversation
(tier_conversation.py), each turn's prefill has one `minipd.kv_tier.fetch` child span within
it: turn 1's asks the tier for its 5 full blocks and finds none (`miss`); turn 2's, past the 5
blocks its own cache has, asks for 3, finds 1 and fetches it (`hit`), its bytes those /metrics
counts as fetched.
"""

from __future__ import annotations

import random
import time

import pytest
from http_helpers import scrape, serving, start_cluster
from kvtier_stores import ALWAYS_FETCH, redis_missing
from otlp_receiver import OtlpReceiver, spans_summary
from tier_conversation import reference_answer, turn_one, turn_two

pytestmark = pytest.mark.skipif(redis_missing() is not None, reason=redis_missing() or "")

WAIT_S = 60.0
FETCH = "minipd.kv_tier.fetch"


@pytest.fixture(scope="module")
def receiver():
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, redis_store, receiver):
    """The router's base URL."""
    flags = ("--model", "tiny", "--dtype", "float32", "--kv-tier", redis_store.url, *ALWAYS_FETCH)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # the children export every 200 ms
        server = start_cluster(
            tmp_path_factory.mktemp("tier-traces"), *flags, "--otlp-traces-endpoint", receiver.endpoint
        )
    with serving(server) as base_url:
        yield base_url


def traceparent(seed: int) -> tuple[str, str]:
    rng = random.Random(seed)
    trace_id = f"{rng.getrandbits(128):032x}"
    return trace_id, f"00-{trace_id}-{rng.getrandbits(64):016x}-01"


def fetch_and_prefill(receiver: OtlpReceiver, trace_id: str) -> tuple[dict, dict]:
    """The trace's one fetch span and one prefill span, once both came."""

    def whole(spans: list[dict]) -> bool:
        names = [s["name"] for s in spans if s["trace_id"] == trace_id]
        return FETCH in names and "minipd.prefill" in names

    receiver.wait_for(whole, WAIT_S, f"trace {trace_id}'s fetch and prefill")
    spans = receiver.spans(trace_id)
    (fetch,) = [s for s in spans if s["name"] == FETCH] or [None]
    (prefill,) = [s for s in spans if s["name"] == "minipd.prefill"]
    assert fetch is not None, spans_summary(spans)
    return fetch, prefill


def wait_for_fetched_bytes(base_url: str) -> float:
    """The bytes fetched on /metrics once the instances reported some (their stats come
    periodically), polled within WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        fetched = sum(
            v
            for (name, labels), v in scrape(base_url).items()
            if name == "minipd_kv_tier_bytes_total" and ("direction", "fetched") in labels
        )
        if fetched > 0:
            return fetched
        assert time.monotonic() < deadline, f"no bytes fetched on /metrics within {WAIT_S} s"
        time.sleep(0.1)  # poll interval of a bounded wait


def test_each_turns_fetch_is_a_span_of_its_prefill_with_what_it_fetched(
    cluster, redis_store, receiver, make_engine, loop_thread
):
    reference = reference_answer(make_engine, loop_thread)
    (trace1, parent1), (trace2, parent2) = traceparent(1), traceparent(2)
    first, _ = turn_one(cluster, redis_store, seed=7, traceparent=parent1)
    turn_two(cluster, first, reference, seed=7, traceparent=parent2)

    fetch, prefill = fetch_and_prefill(receiver, trace1)
    assert fetch["parent_span_id"] == prefill["span_id"] and fetch["service"] == "minipd-instance"
    assert prefill["start_ns"] <= fetch["start_ns"] <= fetch["end_ns"] <= prefill["end_ns"]
    assert fetch["attributes"] == {
        "minipd.kv_tier.local_blocks": 0,
        "minipd.kv_tier.blocks_asked": 5,
        "minipd.kv_tier.blocks_found": 0,
        "minipd.kv_tier.blocks_fetched": 0,
        "minipd.kv_tier.bytes": 0,
        "minipd.kv_tier.hit": False,
        "minipd.kv_tier.outcome": "miss",
    }

    fetch, prefill = fetch_and_prefill(receiver, trace2)
    assert fetch["parent_span_id"] == prefill["span_id"]
    assert prefill["start_ns"] <= fetch["start_ns"] <= fetch["end_ns"] <= prefill["end_ns"]
    attributes = fetch["attributes"]
    fetched_bytes = wait_for_fetched_bytes(cluster)
    assert attributes == {
        "minipd.kv_tier.local_blocks": 5,
        "minipd.kv_tier.blocks_asked": 3,
        "minipd.kv_tier.blocks_found": 1,
        "minipd.kv_tier.blocks_fetched": 1,
        "minipd.kv_tier.bytes": fetched_bytes,
        "minipd.kv_tier.hit": True,
        "minipd.kv_tier.outcome": "hit",
    }
    assert fetched_bytes > 0 and fetch["status_code"] != 2  # not an error
