"""A real Prometheus scraping a minipd router, and the shipped Grafana dashboard's queries.

Shared by tests/processes/test_prometheus_dashboard.py (every panel's query evaluated and
checked) and `bench.py dashboard` (every panel's query evaluated over a range and drawn).

- `start_prometheus(workdir, target, api_key)`: Debian's `prometheus` binary with the shipped
  scrape configuration (deploy/prometheus/prometheus.yml), the target and the API key put in
  where the example says, scraping every second; a `Prometheus` once /-/ready answers, whose
  `stop()` ends it (call it in a `finally`);
- `Prometheus.query` / `query_range` / `wait_for`: its HTTP API (/api/v1/query,
  /api/v1/query_range), raising `PrometheusError` for a refused query;
- `panel_queries(dashboard, window)`: every panel's targets with Grafana's variables replaced
  by concrete values (the dashboard's constants, `window` for `$__rate_interval` and friends);
- `needs_kv_tier(panel)`: whether a panel shows the shared KV tier's series only (empty on a
  cluster without `--kv-tier`);
- `api_post`: one POST to the router's API with its key (an admin call, a request meant to
  be refused), never retried.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, NamedTuple

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "minipd.json"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 10.0
POLL_S = 0.2


class PrometheusError(RuntimeError):
    """Prometheus refused a query, or did not start, or a wait ran out."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_dashboard(path: Path = DASHBOARD) -> dict:
    return json.loads(path.read_text())


def grafana_variables(dashboard: dict, window: str) -> dict[str, str]:
    """Concrete values for every variable the queries may use: the dashboard's constants and
    Grafana's built-in intervals (all `window`)."""
    values = {"__rate_interval": window, "__interval": window, "__range": window}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "constant":
            values[variable["name"]] = variable["query"]
    return values


def concrete(expr: str, variables: dict[str, str]) -> str:
    """`expr` with every `$name` / `${name}` replaced; ValueError naming one it does not know."""
    for name in sorted(variables, key=len, reverse=True):  # $__rate_interval before $__range...
        expr = expr.replace(f"${{{name}}}", variables[name]).replace(f"${name}", variables[name])
    if "$" in expr:
        raise ValueError(f"a Grafana variable with no value here: {expr}")
    return expr


class PanelQuery(NamedTuple):
    panel: str  # the panel's title
    expr: str  # concrete PromQL
    legend: str  # Grafana's legendFormat


KV_TIER_SERIES = "minipd_kv_tier_"


def needs_kv_tier(panel: dict) -> bool:
    return all(KV_TIER_SERIES in target["expr"] for target in panel["targets"])


def panel_queries(dashboard: dict, window: str) -> list[PanelQuery]:
    variables = grafana_variables(dashboard, window)
    return [
        PanelQuery(panel["title"], concrete(target["expr"], variables), target.get("legendFormat", ""))
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's `{{label}}` substitution."""
    for name, value in labels.items():
        template = template.replace("{{" + name + "}}", value).replace("{{ " + name + " }}", value)
    return template


class Prometheus:
    def __init__(self, base_url: str, process: subprocess.Popen, log_path: Path):
        self.base_url, self.process, self.log_path = base_url, process, log_path

    def _get(self, path: str, params: dict[str, str]) -> dict:
        url = f"{self.base_url}{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            raise PrometheusError(f"Prometheus refused {params['query']!r}: {error.read().decode()}") from None
        if body["status"] != "success":
            raise PrometheusError(f"{params['query']!r}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's vector: [{"metric": labels, "value": [t, "v"]}, ...]."""
        data = self._get("/api/v1/query", {"query": expr})
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr!r}: a {data['resultType']}, not a vector")
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict]:
        """A range query's matrix: [{"metric": labels, "values": [[t, "v"], ...]}, ...]."""
        data = self._get("/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": f"{step_s:g}s"})
        return data["result"]

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expr: str, predicate: Callable[[float], bool], what: str, timeout_s: float = 30.0) -> None:
        """Poll `expr` until its first value satisfies `predicate`; PrometheusError past `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.scalar(expr)
            if value is not None and predicate(value):
                return
            if self.process.poll() is not None:
                raise PrometheusError(f"prometheus exited: {self.log_path.read_text()}")
            if time.monotonic() > deadline:
                raise PrometheusError(f"{what}: {expr} is {value} after {timeout_s} s")
            time.sleep(POLL_S)  # poll interval of a bounded wait, not a synchronisation

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)


def scrape_config(target: str, api_key: str, interval: str = "1s") -> dict:
    """The shipped scrape configuration, pointed at `target` with `api_key`, every `interval`."""
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = interval
    (job,) = config["scrape_configs"]
    if not job["authorization"]["credentials"]:
        raise ValueError(f"{SCRAPE_CONFIG}: the example shows no place for the API key")
    job["authorization"]["credentials"] = api_key
    job["static_configs"] = [{"targets": [target]}]
    return config


def start_prometheus(workdir: Path, target: str, api_key: str, interval: str = "1s") -> Prometheus:
    """Prometheus scraping `target` (host:port of a router's HTTP API) through `api_key`, its
    configuration, data and log under `workdir`; returned once ready."""
    if not Path(PROMETHEUS).exists():
        raise PrometheusError(f"{PROMETHEUS} missing: install Debian's prometheus package (.ci/run does)")
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(scrape_config(target, api_key, interval)))
    port = free_port()
    log_path = workdir / "prometheus.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    prometheus = Prometheus(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None:
                raise PrometheusError(f"prometheus exited: {log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{prometheus.base_url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return prometheus
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise PrometheusError(f"prometheus not ready in {READY_TIMEOUT_S} s")
            time.sleep(POLL_S)  # poll interval of a bounded wait, not a synchronisation
    except BaseException:
        prometheus.stop()
        raise


def api_post(base_url: str, path: str, body: dict, api_key: str, timeout_s: float = 120.0) -> tuple[int, dict]:
    """POST `body` as JSON to a minipd HTTP API with its key, once (no retry, unlike the openai
    client, which would resend a 503); (status, decoded body) whatever the status."""
    request = urllib.request.Request(
        f"{base_url}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")
