"""Plots of the engine, transport and overlap experiments (`--plot FILE.png`): each figure set
next to the baseline it is judged against, as the tables do."""

from __future__ import annotations

from benchmarks.loadgen.plotting import save, subplots

BAR_WIDTH = 0.27


def _bars(ax, groups: list[str], series: dict[str, list[float]], ylabel: str) -> None:
    """Grouped bars: one group per x label, one bar per series."""
    for i, (label, values) in enumerate(series.items()):
        offsets = [g + (i - (len(series) - 1) / 2) * BAR_WIDTH for g in range(len(groups))]
        ax.bar(offsets, values, BAR_WIDTH, label=label)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)


def plot_engine(result: dict, path: str) -> None:
    """Serving tokens/s against HF static batches, and decode step time per batch against the
    raw model loop and the weight-streaming floor (and, for a quantized model, the same file
    served dense): one panel for each part that ran."""
    decode = result.get("decode", {})
    parts = [part for part, ran in (("serving", "serving_tok_s" in result), ("decode", bool(decode))) if ran]
    fig, axes = subplots(max(1, len(parts)), width=5.0)
    for part, ax in zip(parts, axes):
        if part == "serving":
            _bars(
                ax,
                ["serving"],
                {
                    "minipd": [result["serving_tok_s"]],
                    f"HF static, batch {result['hf_batch']}": [result["hf_static_tok_s"]],
                },
                "output tokens/s",
            )
            ax.set_title(f"{result['speedup_vs_hf_static']:.2f}x HF static batching", fontsize=10)
            continue
        batches = list(decode)
        weights = f" ({result['weights']})" if "weights" in result else ""
        series = {f"engine step{weights}": [decode[b]["engine_step_ms"] for b in batches]}
        if all("dense_engine_step_ms" in decode[b] for b in batches):  # a quantized model, timed dense beside it
            series["engine step (dense)"] = [decode[b]["dense_engine_step_ms"] for b in batches]
        series["raw model loop"] = [decode[b]["raw_step_ms"] for b in batches]
        series["weight-streaming floor"] = [decode[b]["floor_ms"] for b in batches]
        _bars(ax, [f"batch {b}" for b in batches], series, "decode step (ms)")
        ax.set_title(f"decode step, {result['dtype']}", fontsize=10)
    fig.suptitle(f"engine: {result['model']}, {result['placement']}", fontsize=10)
    save(fig, path)


def plot_neighbour(result: dict, path: str) -> None:
    """Median ITL quiet and beside a CPU-burning neighbour, per placement mode."""
    modes = list(result["modes"])
    fig, (ax,) = subplots()
    _bars(
        ax,
        modes,
        {
            "quiet": [result["modes"][m]["quiet_itl_ms"] for m in modes],
            "with a neighbour": [result["modes"][m]["noisy_itl_ms"] for m in modes],
        },
        "median ITL (ms)",
    )
    ax.set_title("colocated decode ITL beside a CPU-burning neighbour", fontsize=10)
    save(fig, path)


def plot_transport(result: dict, path: str) -> None:
    backends = list(result["backends"])
    fig, (ax,) = subplots()
    _bars(
        ax,
        backends,
        {
            "1 MiB runs": [result["backends"][b]["ratio_to_memcpy"] for b in backends],
            "8 KiB blocks": [result["backends_small_blocks"][b]["ratio_to_memcpy"] for b in backends],
        },
        "bandwidth / single-thread memcpy",
    )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_title(f"transport: {result['request_bytes'] >> 20} MiB per request", fontsize=10)
    save(fig, path)


def plot_overlap(result: dict, path: str) -> None:
    fig, (ax,) = subplots()
    groups, layerwise, after = [], [], []
    for transport, rows in result["transports"].items():
        for n, row in rows.items():
            groups.append(f"{transport}\n{n}")
            layerwise.append(row["exposed_ms_layerwise"])
            after.append(row["exposed_ms_after"])
    _bars(ax, groups, {"layer-wise": layerwise, "send after prefill": after}, "exposed KV transfer (ms)")
    ax.set_title(f"overlap: {result['model']}, {result['layers']} layers", fontsize=10)
    save(fig, path)


def plot_profile(result: dict, path: str) -> None:
    """Measured step times against the fitted latency model, prefill and decode."""
    fig, (pre, dec) = subplots(2, width=5.0)
    p, d = result["prefill"], result["decode"]
    for sample in result["prefill_samples"]:
        lens = sample["prompt_lens"]
        fitted = p["a"] + p["b"] * sum(lens) + p["c"] * sum(n * n for n in lens)
        pre.scatter(sum(lens), sample["seconds"] * 1e3, color="tab:blue", s=14)
        pre.scatter(sum(lens), fitted * 1e3, color="tab:orange", marker="x", s=14)
    pre.set_xlabel("prompt tokens in the step")
    pre.set_ylabel("prefill step (ms)")
    pre.set_title("prefill: measured (dots) vs a + b·Σlen + c·Σlen² (x)", fontsize=9)
    for sample in result["decode_samples"]:
        lens = sample["context_lens"]
        fitted = d["a"] + d["b"] * sum(lens) + d["c"] * len(lens)
        dec.scatter(len(lens), sample["seconds"] * 1e3, color="tab:blue", s=14)
        dec.scatter(len(lens), fitted * 1e3, color="tab:orange", marker="x", s=14)
    dec.set_xlabel("sequences in the step")
    dec.set_ylabel("decode step (ms)")
    dec.set_title("decode: measured (dots) vs a + b·Σcontext + c·batch (x)", fontsize=9)
    fig.suptitle(f"latency profile: {result['model']}, {result['dtype']}, {result['threads']} thread(s)", fontsize=10)
    save(fig, path)


def plot_soak(result: dict, path: str) -> None:
    """The faults over time, and how the requests ended."""
    fig, (timeline, outcome) = subplots(2, width=5.0)
    targets = sorted({e["target"] for e in result["chaos"]})
    colors = {"router-pause": "tab:purple", "instance-pause": "tab:blue", "kill": "tab:red"}
    for event in result["chaos"]:
        row = targets.index(event["target"])
        fault_s, back = max(event["fault_s"], 0.3), event["recovery_s"]  # a kill is an instant; None: never back
        timeline.barh(row, fault_s, left=event["at_s"], color=colors.get(event["kind"]), height=0.5)
        end = event["at_s"] + fault_s
        timeline.barh(row, 5.0 if back is None else back, left=end, color="tab:gray", height=0.5)
        label = "never" if back is None else f"{back:.2f} s"
        timeline.annotate(label, (end + (back or 5.0), row + 0.3), fontsize=7)
    timeline.set_yticks(range(len(targets)), targets)
    timeline.set_xlabel("s: router paused (purple), instance paused (blue), killed (red), then to full capacity (gray)")
    timeline.xaxis.label.set_fontsize(7)
    timeline.set_title(f"faults during {result['duration_s']:.0f} s of load", fontsize=9)
    labels = ["completed", "failed (said why)", "lost", "leaked blocks"]
    values = [result["completed"], result["failed"], result["lost"], result["leaked_blocks"]]
    bars = outcome.bar(labels, values, color=["tab:green", "tab:orange", "tab:red", "tab:red"])
    for bar, value in zip(bars, values):  # the small counts are the point: write every one
        outcome.annotate(str(value), (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    outcome.set_title(f"{result['requests']} requests over {result['transport']}", fontsize=9)
    outcome.tick_params(axis="x", labelsize=8)
    save(fig, path)
