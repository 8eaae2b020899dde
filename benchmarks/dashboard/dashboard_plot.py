"""The dashboard's panels drawn as Grafana lays them out: a grid of the panels' `gridPos` (24
columns wide), each titled as in the dashboard, a time series per target series (a stat panel
as bars of its last values), the y axis in the panel's unit."""

from __future__ import annotations

import math

from benchmarks.loadgen.plotting import save, subplots

COLUMNS = 2  # the dashboard's panels are half its width (w = 12 of 24)
PANEL_WIDTH_IN, PANEL_HEIGHT_IN = 7.0, 3.0
UNIT_LABELS = {"s": "seconds", "percentunit": "share", "short": "", "bytes": "bytes", "Bps": "bytes/s"}
MAX_LEGEND = 8


def _order(panels: list[dict]) -> list[dict]:
    return sorted(panels, key=lambda p: (p["grid"]["y"], p["grid"]["x"]))


def _stat(ax, panel: dict) -> None:
    names, values = [], []
    for target in panel["targets"]:
        for series in target["series"]:
            finite = [v for v in series["v"] if math.isfinite(v)]
            if finite:
                names.append(series["legend"])
                values.append(finite[-1])
    ax.barh(range(len(values)), values, color="tab:blue")
    ax.set_yticks(range(len(values)), names, fontsize=7)
    for i, value in enumerate(values):
        ax.text(value, i, f" {value:g}", va="center", fontsize=7)
    ax.set_xlabel("last value")


def _with_gaps(ts: list[float], vs: list[float]) -> tuple[list[float], list[float]]:
    """The points, with a NaN wherever the series was absent for more than a step (a role an
    instance did not have then), so the line breaks there as Grafana's does."""
    steps = [b - a for a, b in zip(ts, ts[1:]) if b > a]
    if not steps:
        return ts, vs
    step = min(steps)
    out_t, out_v = [ts[0]], [vs[0]]
    for (a, b), v in zip(zip(ts, ts[1:]), vs[1:]):
        if b - a > 1.5 * step:
            out_t.append((a + b) / 2)
            out_v.append(math.nan)
        out_t.append(b)
        out_v.append(v)
    return out_t, out_v


def _timeseries(ax, panel: dict) -> None:
    drawn = 0
    for target in panel["targets"]:
        for series in target["series"]:
            points = [(t, v) for t, v in zip(series["t"], series["v"]) if math.isfinite(v)]
            if not points:
                continue
            ts, vs = _with_gaps(*map(list, zip(*points)))
            ax.plot(ts, vs, linewidth=1.2, label=series["legend"] if drawn < MAX_LEGEND else None)
            drawn += 1
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel(UNIT_LABELS.get(panel["unit"], panel["unit"]))
    if drawn:
        ax.legend(fontsize=6, loc="best")


def plot_panels(panels: list[dict], path: str) -> None:
    ordered = _order(panels)
    rows = -(-len(ordered) // COLUMNS)
    fig, axes = subplots(COLUMNS, rows, PANEL_WIDTH_IN, PANEL_HEIGHT_IN)
    for ax, panel in zip(axes, ordered):
        ax.set_title(panel["title"], fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if panel["type"] == "stat":
            _stat(ax, panel)
        else:
            _timeseries(ax, panel)
        if not any(t["series"] for t in panel["targets"]):
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in axes[len(ordered) :]:
        ax.axis("off")
    save(fig, path)
