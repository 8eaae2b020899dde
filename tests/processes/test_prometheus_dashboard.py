"""The shipped Grafana dashboard's every query, evaluated by a real Prometheus scraping a live cluster.

A process cluster on `tiny` (router, one prefill and one decode process, TCP KV transport)
serves with `--api-key`; Debian's `prometheus` (2.42) scrapes its router every second with
the shipped scrape configuration (deploy/prometheus/prometheus.yml), the key sent as
`authorization: {credentials: ...}`. Known requests go through (long prompts prefilled
remotely, short ones locally by size), and once Prometheus has scraped after the last one,
every `expr` of every panel in deploy/grafana/minipd.json, with Grafana's variables replaced
by concrete values, goes through Prometheus's /api/v1/query: each must return data, every
value finite and non-negative, and the panels whose figures the test knows must show them
(counts equal to the requests sent, latency quantiles within what the client measured).
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import openai
import pytest
import yaml
from http_helpers import start_cluster, stop
from prometheus_client.parser import text_string_to_metric_families

from minipd.api.metrics import LATENCY_BUCKETS_S

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "minipd.json"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
API_KEY = "prometheus-test-key-0123456789"
RATE_WINDOW = "5m"  # $__rate_interval and $__range: longer than the whole test, so every sample counts
NUM_LONG, NUM_SHORT, MAX_TOKENS = 4, 3, 8
DECODING_MAX_TOKENS = 400  # the first request: long enough to be seen decoding on the router's /metrics
PROMETHEUS_TIMEOUT_S = 60.0
SCRAPE_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grafana_variables(dashboard: dict) -> dict[str, str]:
    """Concrete values for every variable the queries may use: the dashboard's constants and
    Grafana's built-in intervals."""
    values = {"__rate_interval": RATE_WINDOW, "__interval": RATE_WINDOW, "__range": RATE_WINDOW}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "constant":
            values[variable["name"]] = variable["query"]
    return values


def concrete(expr: str, variables: dict[str, str]) -> str:
    for name in sorted(variables, key=len, reverse=True):  # $__rate_interval before $__range...
        expr = expr.replace(f"${{{name}}}", variables[name]).replace(f"${name}", variables[name])
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return expr


class Prometheus:
    def __init__(self, base_url: str, process: subprocess.Popen, log_path: Path):
        self.base_url, self.process, self.log_path = base_url, process, log_path

    def query(self, expr: str) -> list[dict]:
        url = f"{self.base_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            raise AssertionError(f"Prometheus refused {expr!r}: {error.read().decode()}") from None
        assert body["status"] == "success", body
        assert body["data"]["resultType"] == "vector", (expr, body["data"]["resultType"])
        return body["data"]["result"]

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expr: str, predicate, what: str) -> None:
        deadline = time.monotonic() + SCRAPE_TIMEOUT_S
        while True:
            value = self.scalar(expr)
            if value is not None and predicate(value):
                return
            assert self.process.poll() is None, self.log_path.read_text()
            assert time.monotonic() < deadline, f"{what}: {expr} is {value} after {SCRAPE_TIMEOUT_S} s"
            time.sleep(0.2)  # poll interval of a bounded wait, not a synchronisation


def start_prometheus(tmp: Path, target: str) -> Prometheus:
    """Prometheus with the shipped scrape configuration, pointed at `target` with the test's key."""
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = "1s"
    (job,) = config["scrape_configs"]
    assert job["authorization"]["credentials"]  # the shipped example shows where the key goes
    job["authorization"]["credentials"] = API_KEY
    job["static_configs"] = [{"targets": [target]}]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = tmp / "prometheus.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    prometheus = Prometheus(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + PROMETHEUS_TIMEOUT_S
    while True:
        assert process.poll() is None, f"prometheus exited: {log_path.read_text()}"
        try:
            with urllib.request.urlopen(f"{prometheus.base_url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return prometheus
        except OSError:
            pass  # not listening yet
        assert time.monotonic() < deadline, f"prometheus not ready in {PROMETHEUS_TIMEOUT_S} s"
        time.sleep(0.2)  # poll interval of a bounded wait, not a synchronisation


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """(prometheus, what the client measured): the cluster served the known requests and
    Prometheus scraped it after the last one."""
    if not Path(PROMETHEUS).exists():
        pytest.fail(f"{PROMETHEUS} missing: install Debian's prometheus package (.ci/run does)")
    tmp = tmp_path_factory.mktemp("prometheus")
    cluster = start_cluster(tmp, "--model", "tiny", "--dtype", "float32", "--api-key", API_KEY)
    prometheus = None
    try:
        target = urllib.parse.urlsplit(cluster.base_url).netloc
        prometheus = start_prometheus(tmp, target)
        prometheus.wait_for('up{job="minipd"}', lambda v: v == 1, "scraped through the API key")
        client = openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key=API_KEY, timeout=60)
        ttfts = []
        prompts = [f"Request {i}: " + "disaggregated prefill and decode " * 8 for i in range(NUM_LONG)]
        prompts += [f"s{i}" for i in range(NUM_SHORT)]
        decoding_seen = {}
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
                decoding_seen = poll_decoding(cluster.base_url)
            for _ in chunks:
                pass
        prometheus.wait_for("sum(minipd_requests_total)", lambda v: v == len(prompts), "scraped after the requests")
        # every pool back to full, as Prometheus saw it (the gauges follow the instances' reports)
        prometheus.wait_for("sum(minipd_kv_blocks_total - minipd_kv_blocks_free)", lambda v: v == 0, "pools full")
        prometheus.wait_for("sum(minipd_requests_running + minipd_requests_waiting)", lambda v: v == 0, "idle")
        measured = {"ttft_min": min(ttfts), "ttft_max": max(ttfts), "requests": len(prompts)}
        measured["decoding_seen"] = decoding_seen
        yield prometheus, {**measured, "router": cluster.base_url}
    finally:
        if prometheus is not None:
            prometheus.process.terminate()
            try:
                prometheus.process.wait(10)
            except subprocess.TimeoutExpired:
                prometheus.process.kill()
                prometheus.process.wait(10)
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
    dashboard = json.loads(DASHBOARD.read_text())
    variables = grafana_variables(dashboard)
    return [
        (panel["title"], concrete(target["expr"], variables))
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def test_the_dashboard_is_grafana_shaped_with_a_prometheus_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
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
    assert decisions["remote_prefill"] == NUM_LONG and decisions["local_prefill_size"] == NUM_SHORT
    assert sum(decisions.values()) == client["requests"]
    phases = by_label(prometheus, "sum by (phase) (minipd_disagg_phase_seconds_count)", "phase")
    assert set(phases.values()) == {NUM_LONG}, phases  # every phase of every remote prefill, none of the local ones
    spent = by_label(prometheus, "sum by (phase) (minipd_disagg_phase_seconds_sum)", "phase")
    # measured, not defaulted (the exposed part may be 0: a layerwise transfer can hide entirely)
    assert all(spent[p] > 0 for p in ("reserve", "prefill_compute", "kv_transfer", "first_token")), spent
    assert spent["first_token"] > max(spent["prefill_compute"], spent["reserve"])  # TTFT contains both
    roles = by_label(prometheus, "sum by (role) (minipd_instance_role)", "role")
    assert roles == {"prefill": 1, "decode": 1}
    assert prometheus.scalar("sum(minipd_kv_transfer_bytes_total)") > 0
    instances = by_label(prometheus, "max by (instance) (minipd_requests_decoding)", "instance")
    assert len(instances) == 2 and set(instances.values()) == {0}  # idle now: nothing prefills or decodes
    assert prometheus.scalar("sum(minipd_request_aborts_total) + sum(minipd_kv_transfer_failures_total)") == 0


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
