"""The shipped Grafana dashboard's every query, evaluated by a real Prometheus scraping a live cluster.

A process cluster on `tiny` (router, one prefill and one decode process, TCP KV transport)
serves with `--api-key` and the ratio controller on; Debian's `prometheus` (2.42) scrapes its
router every second with the shipped scrape configuration (deploy/prometheus/prometheus.yml),
the key sent as `authorization: {credentials: ...}` (benchmarks/dashboard/prometheus_server.py).
The prefill instance is switched to decode and back through the admin API; then known requests
go through (long prompts prefilled remotely, short ones locally by size), and one request that
claims more KV than `--kv-admission-ratio` leaves is refused as an overload while the first
decodes. The instances share a KV tier on a real redis-server (`--kv-tier`), and a two-turn
conversation's second turn fetches one block from it (tier_conversation.py), so the tier's
panels have data too. Once Prometheus has scraped after the last one, every `expr` of every panel in
deploy/grafana/minipd.json, with Grafana's variables replaced by concrete values, goes through
Prometheus's /api/v1/query: each must return data, every value finite and non-negative, and the
panels whose figures the test knows must show them (counts equal to the requests sent, the
switches made and the overload caused, latency quantiles within what the client measured).
"""

from __future__ import annotations

import concurrent.futures
import math
import time
import urllib.error
import urllib.parse
import urllib.request

import openai
import pytest
from http_helpers import start_cluster, stop
from kvtier_stores import ALWAYS_FETCH, redis_missing
from prometheus_client.parser import text_string_to_metric_families
from tier_conversation import TIER_HIT_TOKENS, reference_answer, turn_one, turn_two

from benchmarks.dashboard.prometheus_server import (
    Prometheus,
    api_post,
    load_dashboard,
    panel_queries,
    start_prometheus,
)
from minipd.api.metrics import LATENCY_BUCKETS_S

API_KEY = "prometheus-test-key-0123456789"
RATE_WINDOW = "5m"  # $__rate_interval and $__range: longer than the whole test, so every sample counts
NUM_LONG, NUM_SHORT, MAX_TOKENS = 4, 3, 8
DECODING_MAX_TOKENS = 400  # the first request: long enough to be seen decoding on the router's /metrics
# KV admission at 5% of the decode pool (51 of 1024 blocks): the first request's claim (~30
# blocks) leaves no room for OVERLOAD_MAX_TOKENS (~57 blocks) while it runs; any other fits alone
KV_ADMISSION_RATIO = "0.05"
OVERLOAD_MAX_TOKENS = 900
CONTROLLER_FLAGS = (
    "--ratio-controller",
    "--controller-interval-s",
    "0.25",
    "--controller-min-samples",
    "2",
    "--controller-window-s",
    "600",  # every sample of the test stays in its window
)
SWITCHED = "prefill-0"
NUM_TURNS = 2  # the conversation's, both prefilled remotely
pytestmark = pytest.mark.skipif(redis_missing() is not None, reason=redis_missing() or "")


def switch_role(base_url: str, instance: str, role: str) -> dict:
    status, body = api_post(base_url, "/admin/switch_role", {"instance": instance, "role": role}, API_KEY)
    assert status == 200, body
    return body


@pytest.fixture(scope="module")
def observed(tmp_path_factory, redis_store, make_engine, loop_thread):
    """(prometheus, what the client measured): the cluster served the known requests and
    Prometheus scraped it after the last one."""
    tmp = tmp_path_factory.mktemp("prometheus")
    flags = ("--model", "tiny", "--dtype", "float32", "--api-key", API_KEY, "--kv-tier", redis_store.url, *ALWAYS_FETCH)
    cluster = start_cluster(tmp, *flags, "--kv-admission-ratio", KV_ADMISSION_RATIO, *CONTROLLER_FLAGS)
    prometheus = None
    try:
        target = urllib.parse.urlsplit(cluster.base_url).netloc
        prometheus = start_prometheus(tmp, target, API_KEY)
        prometheus.wait_for('up{job="minipd"}', lambda v: v == 1, "scraped through the API key")
        switches = [switch_role(cluster.base_url, SWITCHED, role) for role in ("decode", "prefill")]
        client = openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key=API_KEY, timeout=60)
        ttfts = []
        prompts = [f"Request {i}: " + "disaggregated prefill and decode " * 8 for i in range(NUM_LONG)]
        prompts += [f"s{i}" for i in range(NUM_SHORT)]
        decoding_seen, overload = {}, None
        for i, prompt in enumerate(prompts):
            started = time.monotonic()
            stream = client.completions.create(
                model="tiny",
                prompt=prompt,
                max_tokens=DECODING_MAX_TOKENS if i == 0 else MAX_TOKENS,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            chunks = iter(stream)
            next(chunks)
            ttfts.append(time.monotonic() - started)
            if i == 0:
                # both at once, while the first request surely runs: one after the other, either
                # could outlast its 400 tokens on a busy machine (the gauge then reads 0, or the
                # overload's claim fits)
                body = {"model": "tiny", "prompt": "x", "max_tokens": OVERLOAD_MAX_TOKENS}
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    refused = pool.submit(api_post, cluster.base_url, "/v1/completions", body, API_KEY)
                    decoding_seen = poll_decoding(cluster.base_url)
                    overload = refused.result(timeout=60)
            for _ in chunks:
                pass
        first, _ = turn_one(cluster.base_url, redis_store, seed=0, api_key=API_KEY)
        second = turn_two(cluster.base_url, first, reference_answer(make_engine, loop_thread), seed=0, api_key=API_KEY)
        num_requests = len(prompts) + NUM_TURNS
        prometheus.wait_for("sum(minipd_requests_total)", lambda v: v == num_requests, "scraped after the requests")
        prometheus.wait_for(
            'sum(minipd_kv_tier_hit_tokens_total{source="tier"})', lambda v: v == TIER_HIT_TOKENS, "the tier's hit"
        )
        # every pool back to full, as Prometheus saw it (the gauges follow the instances' reports)
        prometheus.wait_for("sum(minipd_kv_blocks_total - minipd_kv_blocks_free)", lambda v: v == 0, "pools full")
        prometheus.wait_for("sum(minipd_requests_running + minipd_requests_waiting)", lambda v: v == 0, "idle")
        # the controller decided on the requests' samples since (past too few samples), as scraped
        prometheus.wait_for(
            'sum(minipd_controller_decisions_total{reason!="too_few_samples"})', lambda v: v > 0, "decided"
        )
        prometheus.wait_for("count(minipd_controller_observed_itl_seconds)", lambda v: v == 1, "controller figures")
        # a turn's whole request bounds its TTFT from above
        measured = {"ttft_min": min(ttfts), "ttft_max": max(ttfts + [first.elapsed_s, second.elapsed_s])}
        measured["requests"] = num_requests
        measured.update(decoding_seen=decoding_seen, overload=overload, switches=switches)
        yield prometheus, {**measured, "router": cluster.base_url}
    finally:
        if prometheus is not None:
            prometheus.stop()
        stop(cluster)


def poll_decoding(router: str, timeout: float = 10.0) -> dict[str, float]:
    """The router's per-instance `minipd_requests_decoding`, polled (with the key) until one
    instance decodes or `timeout` passes; the last reading."""
    request = urllib.request.Request(f"{router}/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
        decoding = {
            s.labels["instance"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "minipd_requests_decoding"
        }
        if any(decoding.values()) or time.monotonic() > deadline:
            return decoding
        time.sleep(0.05)  # poll interval of a bounded wait, not a synchronisation


def panel_targets() -> list[tuple[str, str]]:
    return [(q.panel, q.expr) for q in panel_queries(load_dashboard(), RATE_WINDOW)]


def test_the_dashboard_is_grafana_shaped_with_a_prometheus_datasource_variable():
    dashboard = load_dashboard()
    (datasource,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert datasource["query"] == "prometheus"
    assert {"title", "panels", "schemaVersion", "uid"} <= dashboard.keys()
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == f"${{{datasource['name']}}}", panel["title"]
        assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"]), panel["title"]
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys()
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("title, expr", panel_targets())
def test_every_panel_query_returns_sane_data(observed, title, expr):
    prometheus, _ = observed
    result = prometheus.query(expr)
    assert result, f"panel {title!r}: {expr} matches nothing"
    for series in result:
        value = float(series["value"][1])
        assert math.isfinite(value) and value >= 0, (title, expr, series)


def test_the_scrape_works_through_the_api_key_only(observed):
    prometheus, client = observed
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{client['router']}/metrics", timeout=10)
    assert refused.value.code == 401
    assert prometheus.scalar('up{job="minipd"}') == 1


def test_the_decode_instance_reports_the_request_it_decodes(observed):
    _, client = observed
    decoding = client["decoding_seen"]
    assert sorted(decoding.values()) == [0, 1], decoding  # the prefill instance decodes nothing


def by_label(prometheus: Prometheus, expr: str, label: str) -> dict[str, float]:
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in prometheus.query(expr)}


@pytest.mark.timeout(300)
def test_the_panels_show_the_requests_sent_and_where_they_were_prefilled(observed):
    prometheus, client = observed
    finished = by_label(prometheus, "sum by (finish_reason) (minipd_requests_total)", "finish_reason")
    assert finished["length"] == client["requests"] and sum(finished.values()) == client["requests"]
    decisions = by_label(prometheus, "sum by (decision) (minipd_disagg_decisions_total)", "decision")
    assert decisions["remote_prefill"] == NUM_LONG + NUM_TURNS and decisions["local_prefill_size"] == NUM_SHORT
    assert sum(decisions.values()) == client["requests"]
    phases = by_label(prometheus, "sum by (phase) (minipd_disagg_phase_seconds_count)", "phase")
    assert set(phases.values()) == {NUM_LONG + NUM_TURNS}, (
        phases
    )  # every phase of every remote prefill, none of the local ones
    spent = by_label(prometheus, "sum by (phase) (minipd_disagg_phase_seconds_sum)", "phase")
    # measured, not defaulted (the exposed part may be 0: a layerwise transfer can hide entirely)
    measured_phases = ("reserve", "prefill_compute", "kv_transfer", "adopt", "first_token")
    assert all(spent[p] > 0 for p in measured_phases), {p: spent[p] for p in measured_phases}
    assert spent["first_token"] > max(spent["prefill_compute"], spent["reserve"], spent["adopt"])  # TTFT holds them
    roles = by_label(prometheus, "sum by (role) (minipd_instance_role)", "role")
    assert roles == {"prefill": 1, "decode": 1}
    assert by_label(prometheus, "count by (role) (minipd_instance_role)", "role") == roles  # switched back
    assert prometheus.scalar("sum(minipd_kv_transfer_bytes_total)") > 0
    instances = by_label(prometheus, "max by (instance) (minipd_requests_decoding)", "instance")
    assert len(instances) == 2 and set(instances.values()) == {0}  # idle now: nothing prefills or decodes
    assert prometheus.scalar("sum(minipd_request_aborts_total) + sum(minipd_kv_transfer_failures_total)") == 0


@pytest.mark.timeout(300)
def test_the_tier_panels_show_the_conversations_one_fetched_block(observed):
    prometheus, _ = observed
    hits = by_label(prometheus, "sum by (source) (minipd_kv_tier_hit_tokens_total)", "source")
    assert hits["tier"] == TIER_HIT_TOKENS and hits["local"] > 0  # turn 2: its sixth block fetched, 5 local
    assert prometheus.scalar("sum(minipd_kv_tier_fetch_seconds_count)") == 1  # the only prompt the tier had
    moved = by_label(prometheus, "sum by (direction) (minipd_kv_tier_bytes_total)", "direction")
    assert moved["fetched"] > 0 and moved["stored"] > moved["fetched"]
    failures = "minipd_kv_tier_fetch_fallbacks_total + minipd_kv_tier_verification_failures_total"
    assert prometheus.scalar(f"sum({failures} + minipd_kv_tier_timeouts_total)") == 0
    rate = by_label(
        prometheus,
        "sum by (source) (increase(minipd_kv_tier_hit_tokens_total[5m])) / on() group_left() "
        "sum(increase(minipd_kv_tier_lookup_tokens_total[5m]))",
        "source",
    )
    assert 0 < rate["tier"] < rate["local"] < 1


@pytest.mark.timeout(300)
def test_the_ttft_quantiles_lie_within_what_the_client_measured(observed):
    prometheus, client = observed
    # the histogram interpolates within buckets: the client's range, widened to its buckets
    low = max((b for b in LATENCY_BUCKETS_S if b <= client["ttft_min"] / 2), default=0.0)
    high = min(b for b in LATENCY_BUCKETS_S if b >= client["ttft_max"])
    for q in (0.5, 0.9, 0.99):
        expr = f"histogram_quantile({q}, sum by (le) (rate(minipd_time_to_first_token_seconds_bucket[{RATE_WINDOW}])))"
        value = prometheus.scalar(expr)
        assert low <= value <= high, (q, value, client)


@pytest.mark.timeout(300)
def test_the_panels_show_the_role_switches_made_through_the_admin_api(observed):
    prometheus, client = observed
    switches = {
        (s["metric"]["instance"], s["metric"]["from_role"], s["metric"]["to_role"]): float(s["value"][1])
        for s in prometheus.query("sum by (instance, from_role, to_role) (minipd_role_switches_total)")
    }
    assert switches == {(SWITCHED, "prefill", "decode"): 1, (SWITCHED, "decode", "prefill"): 1}
    assert prometheus.scalar(f'max(minipd_instance_role_epoch{{instance="{SWITCHED}"}})') == 2
    last = by_label(prometheus, "max by (drain) (minipd_role_switch_seconds)", "drain")
    reported = client["switches"][-1]  # the admin call's own report of the last switch
    assert last["included"] == pytest.approx(reported["total_s"]) and last["excluded"] <= last["included"]


@pytest.mark.timeout(300)
def test_the_request_claiming_too_much_kv_is_one_overload_and_no_finished_request(observed):
    prometheus, client = observed
    status, body = client["overload"]
    assert status == 503 and body["error"]["type"] == "overloaded_error", body
    overloads = by_label(prometheus, "sum by (cause) (minipd_request_overloads_total)", "cause")
    assert overloads == {"kv_capacity": 1, "waiting_limit": 0, "unavailable": 0}
    assert prometheus.scalar(f"sum(increase(minipd_request_overloads_total[{RATE_WINDOW}]))") > 0  # the panel's


@pytest.mark.timeout(300)
def test_the_controller_panels_show_its_decisions_and_latencies_within_what_the_client_measured(observed):
    prometheus, client = observed
    decisions = {
        (s["metric"]["decision"], s["metric"]["reason"]): float(s["value"][1])
        for s in prometheus.query("sum by (decision, reason) (minipd_controller_decisions_total)")
    }
    # one prefill and one decode instance: the minimum of each, so it can only hold
    assert sum(decisions.values()) > 0
    assert all(v == 0 for (decision, _), v in decisions.items() if decision != "hold"), decisions
    assert decisions["hold", "too_few_samples"] > 0  # before the requests
    observed_ttft = prometheus.scalar("max(minipd_controller_observed_ttft_seconds)")
    estimated_ttft = prometheus.scalar("max(minipd_controller_estimated_ttft_seconds)")
    # p90 of the router's first tokens, each inside the client's TTFT; prefill's part of it
    assert 0 < observed_ttft <= client["ttft_max"] and 0 <= estimated_ttft <= observed_ttft
    observed_itl = prometheus.scalar("max(minipd_controller_observed_itl_seconds)")
    assert 0 < observed_itl < client["ttft_max"] + 1.0
    assert prometheus.scalar("max(minipd_controller_estimated_itl_seconds)") == observed_itl  # an itl objective
    attainment = by_label(prometheus, "max by (objective) (minipd_controller_attainment)", "objective")
    assert set(attainment) == {"ttft", "decode"} and all(0 <= v <= 1 for v in attainment.values())
    assert prometheus.scalar("max(minipd_controller_target_attainment)") == 0.9
