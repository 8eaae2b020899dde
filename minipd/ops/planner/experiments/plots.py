"""The planner's figures (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

import numpy as np

from minipd.ops.planner.experiments.size_sweep import SizeSweep, link_label
from minipd.ops.planner.planner import Plan

GREEN, RED, GREY = "#2e9e4f", "#d2453a", "#888888"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def green_zone(plan: Plan, slo_ttft_s: float | None, slo_decode: tuple[str, float] | None, path: str) -> None:
    """P90 TTFT and P90 per-token latency of every split at the evaluated rate, with the SLO
    lines; a bar is green where the split meets the SLOs (attainment >= target), red otherwise."""
    plt = _pyplot()
    labels = [s.label for s in plan.splits]
    colors = [GREEN if s.meets_slo else RED for s in plan.splits]
    x = np.arange(len(labels))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, 0.7 * len(labels) + 2), 7), sharex=True)
    ttft = [s.eval.ttft_s.p90 * 1000 for s in plan.splits]
    top.bar(x, ttft, color=colors)
    if slo_ttft_s is not None:
        top.axhline(slo_ttft_s * 1000, color="black", linestyle="--", label=f"TTFT SLO {slo_ttft_s * 1000:g} ms")
        top.legend(loc="upper right")
    top.set_yscale("log")
    top.set_ylabel("P90 TTFT (ms)")
    top.set_title(
        f"{plan.profile}, {plan.num_instances} instances, at {plan.eval_rate_rps:.1f} rps\n"
        f"green: SLO attainment >= {plan.target:.0%}; * best goodput",
        fontsize=10,
    )
    kind = slo_decode[0] if slo_decode else "itl"
    # The per-request metric the SLO checks, at its P90 over requests: under the line means at
    # least 90% of requests meet it, as the TTFT bar does for TTFT.
    decode = [(s.eval.tpot_s.p90 if kind == "tpot" else s.eval.request_itl_s.p90) * 1000 for s in plan.splits]
    bottom.bar(x, decode, color=colors)
    if slo_decode is not None:
        bottom.axhline(
            slo_decode[1] * 1000, color="black", linestyle="--", label=f"{kind.upper()} SLO {slo_decode[1] * 1000:g} ms"
        )
        bottom.legend(loc="upper right")
    bottom.set_ylabel("P90 TPOT (ms)" if kind == "tpot" else "P90 over requests of\ntheir own P90 ITL (ms)")
    for i, s in enumerate(plan.splits):
        top.annotate(f"{s.goodput_per_instance:.2f}", (i, ttft[i]), ha="center", va="bottom", fontsize=8)
    bottom.set_xticks(x, [("* " if lab == plan.best else "") + lab for lab in labels], rotation=30, ha="right")
    bottom.set_xlabel("split (numbers on the bars: goodput per instance, rps)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def size_sweep(sweep: SizeSweep, path: str) -> None:
    """Goodput per instance against cluster size: colocated, and the best split per link."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = sweep.sizes
    first = [p for p in sweep.points if p.link_gbps == sweep.link_gbps[0]]
    ax.plot(sizes, [p.colocated_per_instance for p in first], "o-", color=GREY, label="colocated (chunked prefill)")
    for gbps in sweep.link_gbps:
        row = [p for p in sweep.points if p.link_gbps == gbps and p.best_split is not None]
        label = link_label(gbps)
        (line,) = ax.plot(
            [p.num_instances for p in row],
            [p.best_split_per_instance for p in row],
            "s-",
            label=f"best P:D split, link {label}",
        )
        wins_from = sweep.colocated_wins_below[label]
        if wins_from is not None:
            ax.axvline(wins_from, color=line.get_color(), linestyle=":", alpha=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_xlabel("instances")
    ax.set_ylabel("goodput per instance (rps)")
    ax.set_title("where splitting stops paying (dotted: splitting wins from here on)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


MODE_COLORS = {"fixed": GREY, "switch": "tab:blue", "scale": GREEN, "both": "tab:purple"}


def day(result, path: str) -> None:
    """Prefill instances (and, with a scaling mode, instances held) over the day beside TTFT
    and per-token SLO attainment, one line per mode."""
    plt = _pyplot()
    hour = result.seconds_per_hour
    scaling = any(m.name in ("scale", "both") for m in result.modes)
    panels = 4 if scaling else 3
    fig, axes = plt.subplots(panels, 1, figsize=(10, 2.7 * panels), sharex=True)
    roles, ttft, decode = axes[0], axes[-2], axes[-1]
    end = len(result.hours)
    for m in result.modes:
        color = MODE_COLORS[m.name]
        day_roles = [r for r in m.roles if r[0] < end * hour]  # not the backlog's drain after the day
        times = [r[0] / hour for r in day_roles] + [end]
        prefill = [r[1] for r in day_roles]
        style = "--" if m.name == "fixed" else "-"
        roles.step(times, prefill + prefill[-1:], where="post", color=color, linestyle=style, label=m.name)
        if scaling:
            held = [sum(r[1:]) for r in day_roles]
            label = f"{m.name}: {m.gpu_hours:.0f} GPU-h"
            axes[1].step(times, held + held[-1:], where="post", color=color, linestyle=style, label=label)
    roles.set_ylabel("prefill instances")
    if scaling:
        axes[1].set_ylabel("instances held")
        axes[1].legend(loc="lower right", fontsize=8)
    rate = roles.twinx()
    rate.step(
        [h.hour for h in result.hours] + [end],
        [h.rate_rps for h in result.hours] + [result.hours[-1].rate_rps],
        where="post",
        color="tab:orange",
        alpha=0.6,
    )
    rate.set_ylabel("request rate (rps)", color="tab:orange")
    for h in result.hours:
        if h.hour == 0 or result.hours[h.hour - 1].shape != h.shape:
            roles.annotate(
                h.shape,
                (h.hour, 1),
                xycoords=("data", "axes fraction"),
                xytext=(2, -2),
                textcoords="offset points",
                va="top",
                fontsize=8,
            )
    roles.legend(loc="center left", fontsize=8)
    summary = ", ".join(f"{m.name} {m.attainment:.1%}" for m in result.modes)
    roles.set_title(f"{result.profile} x{result.num_instances}, SLO {result.slo}: attainment {summary}", fontsize=10)
    for ax, field, label in (
        (ttft, "ttft_attainment", "TTFT attainment"),
        (decode, "decode_attainment", "ITL/TPOT attainment"),
    ):
        for m in result.modes:
            ax.plot(
                [w.start_s / hour for w in m.windows],
                [getattr(w, field) for w in m.windows],
                color=MODE_COLORS[m.name],
                label=m.name,
            )
        ax.axhline(0.9, color="black", linestyle=":", linewidth=1)
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel(label)
        ax.legend(loc="lower left", fontsize=8)
    decode.set_xlabel(f"hour of the day (each simulated for {hour:g} s)")
    decode.set_xlim(0, end)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
