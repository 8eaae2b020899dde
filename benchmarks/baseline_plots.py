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
    batches = list(result["engine_tok_s"])
    series = {"engine": [result["engine_tok_s"][b] for b in batches],
              "raw model loop": [result["raw_tok_s"][b] for b in batches]}
    if result["hf_tok_s"]:
        series["transformers generate"] = [result["hf_tok_s"].get(b, 0.0) for b in batches]
    fig, (ax,) = subplots()
    _bars(ax, [f"batch {b}" for b in batches], series, "decode tokens/s")
    ax.set_title(f"engine: {result['model']}, {result['torch_threads']} thread(s)", fontsize=10)
    save(fig, path)


def plot_transport(result: dict, path: str) -> None:
    backends = list(result["backends"])
    fig, (ax,) = subplots()
    _bars(ax, backends, {"1 MiB runs": [result["backends"][b]["ratio_to_memcpy"] for b in backends],
                         "8 KiB blocks": [result["backends_small_blocks"][b]["ratio_to_memcpy"] for b in backends]},
          "bandwidth / single-thread memcpy")
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
