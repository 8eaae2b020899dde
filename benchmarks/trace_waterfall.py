"""Draw one trace's spans as a waterfall: `python -m benchmarks.trace_waterfall SPANS.json OUT.png`.

SPANS.json is a list of spans in the shape `tests/support/otlp_receiver.py` flattens OTLP
into (the trace test writes one with `MINIPD_TRACE_JSON=PATH`): hex ids, `start_ns`/`end_ns`
since the epoch, `service`, `instance`, `attributes`, `events`. Spans are drawn in tree order
(each under its parent, siblings by start), one row each, as bars from the first span's start
in milliseconds, coloured by the process that exported them; events are ticks on their span
(a KV transfer's `layer_sent` above the bar, `layer_landed` below, others across it).
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

EVENT_MARKS = {"layer_sent": ("v", 0.28), "layer_landed": ("^", -0.28)}  # marker, offset from the bar's middle


def tree_order(spans: list[dict]) -> list[tuple[int, dict]]:
    """(depth, span) in depth-first order: roots (parents not in the file) first, by start."""
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict]] = {}
    for span in spans:
        parent = span["parent_span_id"] if span["parent_span_id"] in ids else ""
        children.setdefault(parent, []).append(span)
    ordered: list[tuple[int, dict]] = []

    def visit(parent: str, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s["start_ns"]):
            ordered.append((depth, span))
            visit(span["span_id"], depth + 1)

    visit("", 0)
    return ordered


def _label(span: dict) -> str:
    attributes = span["attributes"]
    extra = ""
    if span["name"] == "minipd.try":
        extra = f" {attributes.get('minipd.try', '')}: {attributes.get('minipd.disagg.decision', '')}"
    elif span["name"] == "minipd.prefill.chunk":
        extra = f" {attributes.get('minipd.chunk', '')}"
    elif span["name"] == "minipd.kv_transfer" and "minipd.kv.exposed_s" in attributes:
        extra = f" (exposed {1e3 * attributes['minipd.kv.exposed_s']:.2f} ms)"
    return f"{span['name']}{extra}  [{span['instance']}]"


def draw(spans: list[dict], out: str, title: str | None = None) -> None:
    ordered = tree_order(spans)
    t0 = min(s["start_ns"] for s in spans)
    processes = sorted({s["instance"] for s in spans})
    colours = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(processes)}
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(ordered) + 1.4))
    for row, (_, span) in enumerate(ordered):
        start, end = (span["start_ns"] - t0) / 1e6, (span["end_ns"] - t0) / 1e6
        failed = span.get("status_code") == 2
        ax.barh(
            row,
            max(end - start, 0.05),
            left=start,
            height=0.5,
            color=colours[span["instance"]],
            edgecolor="red" if failed else "none",
            linewidth=1.5,
        )
        for event in span["events"]:
            marker, offset = EVENT_MARKS.get(event["name"], ("|", 0.0))
            ax.plot((event["time_ns"] - t0) / 1e6, row + offset, marker, color="black", markersize=4)
        ax.text(end, row, f" {end - start:.1f} ms", va="center", fontsize=7)
    ax.set_yticks(range(len(ordered)))
    ax.set_yticklabels(["    " * depth + _label(span) for depth, span in ordered], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the request's span began")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[p]) for p in processes]
    ax.legend(handles, processes, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, title="process")
    ax.set_title(title or f"trace {spans[0]['trace_id']}  (▼ layer sent, ▲ layer landed, | other events)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spans", help="a JSON list of spans of one trace (MINIPD_TRACE_JSON of the trace test)")
    parser.add_argument("out", help="the PNG to write")
    args = parser.parse_args(argv)
    with open(args.spans) as f:
        spans = json.load(f)
    if not spans:
        parser.error(f"{args.spans}: no spans")
    draw(spans, args.out)
    print(f"wrote {args.out}: {len(spans)} spans")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
