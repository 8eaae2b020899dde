"""dashboard: the shipped Grafana dashboard's panels over a live cluster, as a real Prometheus sees them.

A process cluster on `tiny` (`minipd --role cluster`, one prefill and one decode instance,
TCP KV) serves with `--api-key`, the ratio controller on and a tight `--kv-admission-ratio`;
Debian's `prometheus` scrapes its router every second with the shipped scrape configuration
(benchmarks/dashboard/prometheus_server.py, as tests/processes/test_prometheus_dashboard.py).
The load (dashboard_load.py) runs for `--duration-s`: Poisson arrivals of long and short
prompts, the prefill instance switched to decode and back through the admin API, and now and
then a request refused as an overload. Then every query of every panel in
deploy/grafana/minipd.json goes through /api/v1/query_range over the run, `$__rate_interval`
being `--rate-window`, and `--plot` draws the panels in the dashboard's grid, titled as there.
The cluster runs without a shared KV tier: the tier's panels are drawn empty and not counted
as empty panels (tests/processes/test_prometheus_dashboard.py checks them with a tier).

    python bench.py dashboard --json docs/results/dashboard.json --plot docs/figures/grafana_panels.png
"""

from __future__ import annotations

import argparse
import math
import secrets
import shutil
import tempfile
import time
import urllib.parse
from pathlib import Path

import msgspec

from benchmarks.dashboard.dashboard_load import LoadOptions, drive
from benchmarks.dashboard.dashboard_plot import plot_panels
from benchmarks.dashboard.prometheus_server import (
    Prometheus,
    PrometheusError,
    concrete,
    grafana_variables,
    legend,
    load_dashboard,
    needs_kv_tier,
    start_prometheus,
)
from benchmarks.loadgen.deployments import ServerOptions, start_disaggregated
from benchmarks.loadgen.processes import Processes

SWITCHED = "prefill-0"
KV_ADMISSION_RATIO = 0.06  # 61 of the decode pool's 1024 blocks: the load fits, an oversized request does not
OVERLOAD_MAX_TOKENS = 975  # with a one-token prompt, 61 blocks of 16: refused beside any other live request
SETTLE_TIMEOUT_S = 60.0
QUICK = {"duration_s": 15.0, "request_rate": 2.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration-s", type=float, default=90.0, help="how long the load runs (default: %(default)s)")
    parser.add_argument("--request-rate", type=float, default=3.0, help="requests per second (default: %(default)s)")
    parser.add_argument("--min-tokens", type=int, default=8, help="shortest answer (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=64, help="longest answer (default: %(default)s)")
    parser.add_argument("--overload-every-s", type=float, default=10.0, help="(default: %(default)s)")
    parser.add_argument("--rate-window", default="10s", help="what $__rate_interval becomes (default: %(default)s)")
    parser.add_argument("--step-s", type=float, default=1.0, help="query_range resolution (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="15 s of load: a check of the harness")


def _options(args: argparse.Namespace) -> LoadOptions:
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if not (args.duration_s > 0 and args.request_rate > 0 and args.step_s > 0 and args.overload_every_s > 0):
        raise ValueError("--duration-s, --request-rate, --step-s and --overload-every-s must be positive")
    if not 1 <= args.min_tokens <= args.max_tokens:
        raise ValueError("--min-tokens and --max-tokens: need 1 <= min <= max")
    return LoadOptions(
        duration_s=args.duration_s,
        request_rate=args.request_rate,
        min_tokens=args.min_tokens,
        max_tokens=args.max_tokens,
        overload_max_tokens=OVERLOAD_MAX_TOKENS,
        overload_every_s=args.overload_every_s,
        switched=SWITCHED,
    )


def _series(matrix: list[dict], template: str, start: float) -> list[dict]:
    return [
        {
            "legend": legend(template, s["metric"]) or "value",
            "t": [float(t) - start for t, _ in s["values"]],
            "v": [float(v) for _, v in s["values"]],
        }
        for s in matrix
    ]


def run(args: argparse.Namespace) -> dict:
    options = _options(args)
    dashboard = load_dashboard()
    api_key = secrets.token_urlsafe(24)
    router_flags = (
        "--api-key",
        api_key,
        "--ratio-controller",
        "--kv-admission-ratio",
        str(KV_ADMISSION_RATIO),
    )
    workdir = Path(tempfile.mkdtemp(prefix="minipd-dashboard-"))
    try:
        with Processes() as processes:
            server = ServerOptions(model="tiny", max_model_len=1024, extra_flags=("--dtype", "float32"))
            deployment = start_disaggregated(processes, server, router_flags=router_flags)
            base_url = deployment.urls[0]
            prometheus = start_prometheus(workdir, urllib.parse.urlsplit(base_url).netloc, api_key)
            try:
                prometheus.wait_for('up{job="minipd"}', lambda v: v == 1, "scraped through the API key")
                started = time.time()
                report = drive(base_url, api_key, options)
                # every request sent ended as finished or as an overload (503), as scraped
                ended = report.sent + report.overloads_sent
                prometheus.wait_for(
                    "sum(minipd_requests_total) + sum(minipd_request_overloads_total)",
                    lambda v: v >= ended,
                    "scraped after the load",
                    SETTLE_TIMEOUT_S,
                )
                end = time.time()
                panels = _evaluate(prometheus, dashboard, args.rate_window, started, end, args.step_s)
            finally:
                prometheus.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    tierless = {p["title"] for p in dashboard["panels"] if needs_kv_tier(p)}
    empty = [p["title"] for p in panels if not any(t["series"] for t in p["targets"]) and p["title"] not in tierless]
    return {
        "launch": deployment.launch,
        "duration_s": end - started,
        "rate_window": args.rate_window,
        "step_s": args.step_s,
        "load": msgspec.to_builtins(report),
        "panels": panels,
        "empty_panels": empty,
        "checks_failed": bool(empty),
    }


def _evaluate(
    prometheus: Prometheus, dashboard: dict, window: str, start: float, end: float, step_s: float
) -> list[dict]:
    """Every panel, in the dashboard's order, with each target's series over [start, end]."""
    variables = grafana_variables(dashboard, window)
    panels = []
    for panel in dashboard["panels"]:
        targets = []
        for target in panel["targets"]:
            expr = concrete(target["expr"], variables)
            try:
                matrix = prometheus.query_range(expr, start, end, step_s)
            except PrometheusError as exc:
                raise RuntimeError(f"panel {panel['title']!r}: {exc}") from None
            targets.append({"expr": expr, "series": _series(matrix, target.get("legendFormat", ""), start)})
        panels.append(
            {
                "title": panel["title"],
                "type": panel["type"],
                "unit": panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""),
                "grid": panel["gridPos"],
                "targets": targets,
            }
        )
    return panels


def print_table(result: dict) -> None:
    load = result["load"]
    print(
        f"{result['launch']}: {result['duration_s']:.0f} s, {load['sent']} requests "
        f"({load['completed']} completed, {load['failed']} failed), "
        f"{load['overloads_refused']}/{load['overloads_sent']} oversized ones refused, "
        f"switches {[(s['role'], s['status']) for s in load['switches']]}"
    )
    print(f"{'panel':<62} {'series':>6} {'last values':<40}")
    for panel in result["panels"]:
        series = [s for t in panel["targets"] for s in t["series"]]
        last = [s["v"][-1] for s in series if s["v"]]
        shown = ", ".join(f"{v:.3g}" for v in last[:5] if math.isfinite(v)) or "-"
        print(f"{panel['title'][:62]:<62} {len(series):>6} {shown:<40}")
    if result["empty_panels"]:
        print(f"panels with no data: {result['empty_panels']}")


def plot(result: dict, path: str) -> None:
    plot_panels(result["panels"], path)
