"""validate's report: the table of simulated against measured figures (`print_table`) and
the parity chart (`plot`), from the result `validate_bench.run` returns, and the result's
account of a latency profile (`profile_summary`).
"""

from __future__ import annotations

import msgspec

from benchmarks.loadgen.measure import MS_PER_S
from benchmarks.loadgen.plotting import save, subplots
from benchmarks.validate.validate_compare import JITTER_SEEDS, LATENCY_TOLERANCE, METRICS, within
from minipd.ops.planner.latency_profile import LatencyProfile


def profile_summary(profile: LatencyProfile) -> dict:
    """What the result says of a latency profile: its step models, their fit and its origin."""
    return {
        "name": profile.name,
        "model": profile.model,
        "dtype": profile.dtype,
        "threads": profile.threads,
        "prefill": msgspec.to_builtins(profile.prefill),
        "decode": msgspec.to_builtins(profile.decode),
        "prefill_r2": profile.prefill_fit.r2 if profile.prefill_fit else None,
        "decode_r2": profile.decode_fit.r2 if profile.decode_fit else None,
        "prefill_steps": profile.prefill_fit.num_samples if profile.prefill_fit else None,
        "decode_steps": profile.decode_fit.num_samples if profile.decode_fit else None,
    }


def print_table(result: dict) -> None:
    p = result["profile"]
    print(
        f"validate: simulator vs a real 1P:1D cluster of {p['model']} ({p['dtype']}, {result['torch_threads']} "
        f"thread(s) per instance); profile {p['name']} (R^2 prefill {p['prefill_r2']}, decode {p['decode_r2']})"
    )
    for label, prof in (("in-process profile", p), ("serving profile", result["serving_profile"])):
        pre, dec = prof["prefill"], prof["decode"]
        steps = f", from {prof['prefill_steps']} + {prof['decode_steps']} steps" if label == "serving profile" else ""
        print(
            f"  {label}: prefill {pre['a'] * MS_PER_S:.1f} ms + {pre['b'] * MS_PER_S:.3f} ms/token + "
            f"{pre['c'] * 1e6:.3f} us/qk (R^2 {prof['prefill_r2']:.3f}); decode {dec['a'] * MS_PER_S:.1f} ms + "
            f"{dec['b'] * 1e6:.2f} us/ctx + {dec['c'] * MS_PER_S:.2f} ms/seq (R^2 {prof['decode_r2']:.3f}){steps}"
        )
    probe = result["serving_path_probe"]
    print(
        f"  serving-path probe ({probe['requests']} requests alone, {probe['prompt_len']} -> {probe['output_len']} "
        f"tokens): TTFT P50 {probe['measured_ttft_p50_ms']:.1f} ms measured, {probe['simulated_ttft_p50_ms']:.1f} "
        f"simulated -> request overhead {probe['request_overhead_ms']:.1f} ms; token gap P50 "
        f"{probe['measured_gap_p50_ms']:.1f} ms measured, {probe['simulated_gap_p50_ms']:.1f} simulated; first gap "
        f"P50 {probe['measured_first_gap_p50_ms']:.1f} ms -> decode join delay {probe['decode_join_delay_ms']:.1f} ms"
    )
    jitter = ", ".join(
        f"{role} {j['sigma_slow']:.3f} slow over {j['tau_s']:.2f} s + {j['sigma_step']:.3f} per step"
        for role, j in result["serving_jitter"].items()
    )
    print(f"  fitted jitter (std of log step time): {jitter}")
    print(
        "  simulated: with the run's measured speed; predicted: with the fitted jitter instead "
        f"(median of {JITTER_SEEDS} draws); profile only: the in-process profile"
    )
    print(
        f"{'workload':>13} {'run':>3} {'metric':>12} {'simulated':>10} {'measured':>10} {'error':>7} "
        f"{'predicted':>10} {'profile only':>13}"
    )
    for name, w in result["workloads"].items():
        for i, row in enumerate(w["runs"]):
            speed = ", ".join(
                f"{role} x{v['mean']:.2f} (P10-P90 {v['p10']:.2f}-{v['p90']:.2f})" for role, v in row["speed"].items()
            )
            print(f"{name:>13} {i:>3} speed against the fitted profile: {speed}")
            for m in METRICS:
                err = row["relative_error"][m]
                flag = "" if within(err, result["tolerance"]["latency"]) else "  miss"
                print(
                    f"{name:>13} {i:>3} {m:>12} {row['simulated'][m]:>8.1f}ms {row['measured'][m]:>8.1f}ms "
                    f"{err:>+7.1%} {row['predicted']['relative_error'][m]:>+10.1%} "
                    f"{row['profile_only']['relative_error'][m]:>+13.1%}{flag}"
                )
            diff = row["attainment_diff"]
            flag = "" if within(diff, result["tolerance"]["attainment"]) else "  miss"
            slo = " ".join(f"{k.removesuffix('_ms')}:{v:g}" for k, v in row["slo"].items())
            print(
                f"{name:>13} {i:>3} {'attainment':>12} {row['simulated']['attainment']:>10.1%} "
                f"{row['measured']['attainment']:>10.1%} {diff * 100:>+6.1f}pt "
                f"{row['predicted']['attainment_diff'] * 100:>+8.1f}pt "
                f"{row['profile_only']['attainment_diff'] * 100:>+11.1f}pt{flag}   (SLO {slo}; other jobs "
                f"{row['measured']['foreign_cpu']:.0%})"
            )
        print(
            f"{name:>13}: {w['runs_within_targets']} of {len(w['runs'])} runs within every target "
            f"({w['runs_within_targets_predicted']} predicted)"
        )
        pooled = w["pooled"]
        figures = ", ".join(
            f"{m.removesuffix('_ms')} {pooled['simulated'][m]:.1f}/{pooled['measured'][m]:.1f} ms "
            f"({pooled['relative_error'][m]:+.1%})"
            for m in METRICS
        )
        print(
            f"{name:>13}: the {pooled['num_requests']} requests of its runs together, simulated/measured: {figures}; "
            f"attainment {pooled['simulated']['attainment']:.1%}/{pooled['measured']['attainment']:.1%} "
            f"({pooled['attainment_diff'] * 100:+.1f}pt): {'within' if pooled['within_targets'] else 'outside'} "
            "the targets"
        )
    print(f"lost requests: {result['lost_requests']}")


def plot(result: dict, path: str) -> None:
    """A parity chart per workload: every run's simulated figure against its measured one
    (filled: at the run's measured speed; hollow: predicted), the ±15% band around y = x."""
    names = list(result["workloads"])
    fig, axes = subplots(ncols=len(names), width=5.5)
    from matplotlib.ticker import NullFormatter  # after subplots() has set matplotlib up headless

    markers = dict(zip(METRICS, "osD^"))
    for ax, name in zip(axes, names, strict=True):
        runs = result["workloads"][name]["runs"]
        values = [
            r[side][m] for r in runs for m in METRICS for side in ("measured", "simulated", "simulated_predicted")
        ]
        lo, hi = min(values) / 1.3, max(values) * 1.3
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
        ax.fill_between(
            [lo, hi],
            [lo * (1 - LATENCY_TOLERANCE), hi * (1 - LATENCY_TOLERANCE)],
            [lo * (1 + LATENCY_TOLERANCE), hi * (1 + LATENCY_TOLERANCE)],
            color="tab:green",
            alpha=0.15,
            label="±15%",
        )
        for m in METRICS:
            label = m.removesuffix("_ms").replace("_", " ")
            ax.scatter(
                [r["measured"][m] for r in runs],
                [r["simulated"][m] for r in runs],
                marker=markers[m],
                color="tab:blue",
                label=f"{label} (run's speed)",
            )
            ax.scatter(
                [r["measured"][m] for r in runs],
                [r["simulated_predicted"][m] for r in runs],
                marker=markers[m],
                facecolors="none",
                edgecolors="tab:orange",
                label=f"{label} (predicted)",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())  # the minor ticks' labels overlap over a decade
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured (ms)")
        ax.set_ylabel("simulated (ms)")
        att = ", ".join(f"{r['simulated']['attainment']:.0%}/{r['measured']['attainment']:.0%}" for r in runs)
        ax.set_title(f"{name}: attainment sim/measured {att}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6, ncol=2)
    save(fig, path)
