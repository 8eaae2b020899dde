"""One dashboard snapshot: instances by pool, KV links, latency against the SLOs, the controller.

`SnapshotBuilder.build()` is called once per tick (sse.SnapshotHub) and returns a dict that
encodes to JSON as it is:
- `time` (Unix seconds), `mode` (`router` or `colocated`), `window_s`, `controls` (which
  control calls this server has: `role_switch`);
- `pools`: `prefill`, `decode`, `colocated`, each a list of instance rows (instances.py);
- `links`: per prefill->decode pair, the KV `bytes` and `requests` within the window and
  `bytes_per_s` (bytes over the window, or over the uptime while that is shorter);
- `latency`: `ttft` and `itl`, each `p50`, `p90`, `p99` (seconds; None without samples) and
  `count`, over the window's samples (ITL: every inter-token gap);
- `slo` (`ttft_s`, `itl_s`, `source`: `controller`, `default` or `page`), `attainment`
  (`ttft`: share of first tokens within the TTFT SLO, `itl`: share of gaps within the ITL SLO,
  None without samples; `target`; `verdict`: `met` when both reach the target, `violated` when
  one misses it, `no data` before both have samples);
- `series`: the last `series_len` ticks of `t` and the six percentiles, and `verdict` per tick;
- `requests`: the latest finished requests (request_window.RequestRecord), newest first;
- `totals`: `requests` finished and KV `bytes` moved since start (/metrics' counters agree);
- `kv_tier`: None when no live instance has a shared KV tier, else its figures per instance and
  in total (kv_tier_view.py; /metrics' `minipd_kv_tier_*` agree);
- `controller`: None, or its SLO, target, window, last decision and moves.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable, Protocol

import msgspec
import numpy as np

from minipd.ops.dashboard.kv_tier_view import kv_tier_view
from minipd.ops.dashboard.request_window import RequestWindow
from minipd.slo.targets import SLO

PERCENTILES = (50, 90, 99)
DEFAULT_SERIES_LEN = 300  # five minutes of one-second ticks
DEFAULT_TARGET = 0.9
MET, VIOLATED, NO_DATA = "met", "violated", "no data"
SERIES_KEYS = tuple(f"{kind}_p{p}" for kind in ("ttft", "itl") for p in PERCENTILES)


class InstanceRows(Protocol):
    def rows(self) -> list[dict]: ...


class DashboardSLO(msgspec.Struct, frozen=True):
    """The SLO the page judges against: TTFT and the per-token bound, in seconds."""

    ttft_s: float
    itl_s: float
    source: str = "default"  # "controller", "default" or "page"

    @classmethod
    def from_slo(cls, slo: SLO, source: str) -> DashboardSLO:
        decode = slo.decode_bound
        if slo.ttft_s is None or decode is None:
            raise ValueError("slo: needs a ttft objective and an itl or tpot objective")
        return cls(slo.ttft_s, decode[1], source)


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    if not len(values):
        return {f"p{p}": None for p in PERCENTILES} | {"count": 0}
    qs = np.percentile(values, PERCENTILES)
    return {f"p{p}": float(q) for p, q in zip(PERCENTILES, qs)} | {"count": int(len(values))}


def share_within(values: np.ndarray, bound: float) -> float | None:
    return float(np.mean(values <= bound)) if len(values) else None


def verdict(ttft: float | None, itl: float | None, target: float) -> str:
    if ttft is None or itl is None:
        return NO_DATA
    return MET if ttft >= target and itl >= target else VIOLATED


def _finite(value: float) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def controller_view(controller) -> dict | None:
    """The live ratio controller's state for the page (None: no controller)."""
    if controller is None:
        return None
    config = controller.policy.config
    decision = getattr(controller, "last_decision", None)
    return {
        "slo": config.slo.as_ms(),
        "target": config.target,
        "window_s": config.window_s,
        "cooldown_s": config.cooldown_s,
        "last_decision": None
        if decision is None
        else {
            "move": decision.move.value,
            "reason": decision.reason,
            "ttft_attainment": _finite(decision.ttft_attainment),
            "decode_attainment": _finite(decision.decode_attainment),
        },
        "moves": msgspec.to_builtins(controller.moves[-20:]),
    }


class SnapshotBuilder:
    def __init__(
        self,
        window: RequestWindow,
        instances: InstanceRows,
        slo: DashboardSLO,
        mode: str,
        controls: dict[str, bool],
        controller: Callable[[], object] = lambda: None,
        series_len: int = DEFAULT_SERIES_LEN,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.window, self.instances, self.default_slo, self.mode = window, instances, slo, mode
        self.page_slo: DashboardSLO | None = None  # set from the page: wins over the others
        self.controls, self.controller, self.clock = controls, controller, clock
        self.started = clock()
        self.series: dict[str, deque] = {key: deque(maxlen=series_len) for key in ("t", *SERIES_KEYS, "verdict")}

    @property
    def target(self) -> float:
        controller = self.controller()
        return controller.policy.config.target if controller is not None else DEFAULT_TARGET

    @property
    def slo(self) -> DashboardSLO:
        """The page's SLO once set there, else the running controller's, else the default."""
        if self.page_slo is not None:
            return self.page_slo
        controller = self.controller()
        if controller is not None:
            return DashboardSLO.from_slo(controller.policy.config.slo, "controller")
        return self.default_slo

    def set_slo(self, ttft_s: float, itl_s: float) -> DashboardSLO:
        self.page_slo = DashboardSLO(ttft_s, itl_s, "page")
        return self.page_slo

    def build(self) -> dict:
        window, slo = self.window, self.slo
        window.prune()
        ttft, itl = window.ttft_values(), window.itl_values()
        latency = {"ttft": percentiles(ttft), "itl": percentiles(itl)}
        target = self.target
        attainment = {"ttft": share_within(ttft, slo.ttft_s), "itl": share_within(itl, slo.itl_s), "target": target}
        attainment["verdict"] = verdict(attainment["ttft"], attainment["itl"], target)
        self._append_series(latency, attainment["verdict"])
        rows = self.instances.rows()
        pools: dict[str, list[dict]] = {"prefill": [], "decode": [], "colocated": []}
        for row in rows:
            pools.setdefault(row["pool"], []).append(row)
        span = max(1e-9, min(window.window_s, self.clock() - self.started))
        links = [
            {"prefill": p, "decode": d, "bytes": b, "requests": n, "bytes_per_s": b / span}
            for (p, d), (b, n) in sorted(window.link_bytes().items())
        ]
        return {
            "time": time.time(),
            "mode": self.mode,
            "window_s": window.window_s,
            "controls": self.controls,
            "pools": pools,
            "num_instances": len(rows),
            "links": links,
            "latency": latency,
            "slo": msgspec.to_builtins(slo),
            "attainment": attainment,
            "series": {key: list(values) for key, values in self.series.items()},
            "requests": [msgspec.to_builtins(r) for r in reversed(window.records)],
            "totals": {"requests": window.num_requests, "kv_bytes": window.num_kv_bytes},
            "controller": controller_view(self.controller()),
            "kv_tier": kv_tier_view([row for row in rows if row["liveness"] != "dead"]),
        }

    def _append_series(self, latency: dict, tick_verdict: str) -> None:
        self.series["t"].append(round(time.time(), 3))
        for kind in ("ttft", "itl"):
            for p in PERCENTILES:
                self.series[f"{kind}_p{p}"].append(latency[kind][f"p{p}"])
        self.series["verdict"].append(tick_verdict)
