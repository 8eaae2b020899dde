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
    """Left: serving tokens/s against HF static batches; right: decode step time per batch
    against the raw model loop and the weight-streaming floor."""
    fig, axes = subplots(2, width=5.0)
    if "serving_tok_s" in result:
        _bars(
            axes[0],
            ["serving"],
            {
                "minipd": [result["serving_tok_s"]],
                f"HF static, batch {result['hf_batch']}": [result["hf_static_tok_s"]],
            },
            "output tokens/s",
        )
        axes[0].set_title(f"{result['speedup_vs_hf_static']:.2f}x HF static batching", fontsize=10)
    decode = result.get("decode", {})
    batches = list(decode)
    if batches:
        _bars(
            axes[1],
            [f"batch {b}" for b in batches],
            {
                "engine step": [decode[b]["engine_step_ms"] for b in batches],
                "raw model loop": [decode[b]["raw_step_ms"] for b in batches],
                "weight-streaming floor": [decode[b]["floor_ms"] for b in batches],
            },
            "decode step (ms)",
        )
        axes[1].set_title(f"decode step, {result['dtype']}", fontsize=10)
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
