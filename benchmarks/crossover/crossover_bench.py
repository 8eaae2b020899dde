"""crossover: per prompt length, the KV link bandwidth at which disaggregation stops paying.

Disaggregation adds the exposed KV transfer to a prompt's TTFT and removes that prompt's
prefill from the steps of the decodes running beside it. For each prompt length P:

1. interference (one colocated instance): a decode stream runs; a probe of P tokens is
   prefilled beside it; I(P) is the time the stream loses (its gaps overlapping the
   prefill, less its undisturbed gap);
2. transfer cost (1 prefill + 1 decode instance): the probe's TTFT on a link of B minus its
   TTFT on an unlimited link, probed back to back so the drift of a shared machine cancels.
   The link is a tc-shaped veth between network namespaces, reshaped between probes
   (`--link-method netns`, needs root), or the transports' token bucket, one cluster per
   bandwidth beside an unlimited one (`bucket`);
3. measured crossover: where that extra TTFT reaches I(P), going from generous to starved
   (interpolated in 1/B); modelled crossover: where the layer-wise transfer model
   (benchmarks/loadgen/crossover_model.py) exposes I(P), from the KV bytes the router
   counted, the prefill time and the layer count, against the modelled interference.
Every figure is a median over `--repeats` interleaved probes. Below the crossover the link
costs a prompt more than colocation costs its neighbours.

    python bench.py crossover --model small --json crossover.json --plot crossover.png
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from benchmarks.loadgen import options
from benchmarks.loadgen.crossover_model import measured_crossover_gbps, model_crossover_gbps, model_interference_s
from benchmarks.loadgen.crossover_runs import BACKGROUND_PROMPT_LEN, ExtraTtft, Link, extra_ttft, interference
from benchmarks.loadgen.deployments import ServerOptions, start_colocated, start_disaggregated
from benchmarks.loadgen.host_load import ForeignCpu, QuietGuard
from benchmarks.loadgen.model_facts import num_layers
from benchmarks.loadgen.netns import ShapedLink, unavailable_reason
from benchmarks.loadgen.netns_cluster import start_netns_cluster
from benchmarks.loadgen.plotting import save, subplots
from benchmarks.loadgen.processes import Processes

MS = 1e3
DEFAULT_PROMPT_LENS = (256, 512, 1024, 2048)
DEFAULT_GBPS = (2.0, 0.5, 0.25, 0.15, 0.1, 0.07, 0.05)
DEFAULT_CHUNK_TOKENS = 512
QUICK = {"model": "tiny", "prompt_lens": [512, 1024], "gbps": [0.03], "repeats": 2, "background_tokens": 400}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_client_arguments(parser)
    options.add_server_arguments(parser)
    parser.set_defaults(max_num_batched_tokens=DEFAULT_CHUNK_TOKENS)
    g = parser.add_argument_group("crossover")
    g.add_argument("--prompt-lens", type=int, nargs="+", default=list(DEFAULT_PROMPT_LENS))
    g.add_argument(
        "--gbps",
        type=float,
        nargs="+",
        default=list(DEFAULT_GBPS),
        help="KV link bandwidths of the sweep, Gbit/s (default: %(default)s)",
    )
    g.add_argument("--repeats", type=int, default=5, help="probes per prompt length and link (median)")
    g.add_argument(
        "--link-method",
        choices=["auto", "netns", "bucket"],
        default="auto",
        help="starve the KV link with a tc-shaped veth between namespaces (one cluster, reshaped "
        "between probes; needs root) or the transports' token bucket (a cluster per bandwidth); "
        "auto: netns where possible (default)",
    )
    g.add_argument("--background-tokens", type=int, default=1024, help="length of the decode stream")
    g.add_argument("--num-layers", type=int, default=None, help="layers of the model (default: read from --model)")
    g.add_argument("--tokenizer", default=None, help="as for the other experiments (default: from --model)")
    g.add_argument("--seed", type=int, default=0)


def _server(args: argparse.Namespace) -> ServerOptions:
    max_len = max(max(args.prompt_lens), BACKGROUND_PROMPT_LEN + args.background_tokens) + options.SPECIAL_TOKENS_MARGIN
    max_len = -(-max_len // options.BLOCK_ALIGN) * options.BLOCK_ALIGN
    # room for the longest probe beside the decode stream, and no more: several deployments are up at once
    num_blocks = args.num_blocks or 2 * max_len // options.BLOCK_ALIGN + options.BLOCK_ALIGN
    return ServerOptions(
        model=args.model,
        torch_threads=args.torch_threads,
        max_model_len=max_len,
        num_blocks=num_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        transport=args.transport,
        extra_flags=tuple(args.server_flag),
    )


def _link_method(args: argparse.Namespace) -> str:
    if args.link_method != "auto":
        return args.link_method
    return "netns" if unavailable_reason() is None else "bucket"


def _measure_links(
    args: argparse.Namespace, builder, server: ServerOptions, bandwidths: list[float], base_url: str, method: str
) -> ExtraTtft:
    """Extra TTFT per bandwidth against the unlimited `base_url`, by `method`."""
    timeout = args.request_timeout_s
    guard = QuietGuard(args.max_foreign_cpu, args.quiet_wait_s, args.max_reruns)
    if method == "netns":  # one cluster across a tc-shaped veth, reshaped before each probe
        with ShapedLink() as link, Processes() as processes:
            url = start_netns_cluster(processes, link, server).urls[0]
            links = [Link(g, url, lambda g=g: link.set_rate(g)) for g in bandwidths]
            return asyncio.run(
                extra_ttft(
                    Link(None, url, link.unshape),
                    links,
                    args.prompt_lens,
                    args.repeats,
                    builder,
                    "netns",
                    timeout,
                    guard,
                )
            )
    merged: dict[float, list[float]] = {}
    baselines, kv = [], []
    for g in bandwidths:  # the token bucket is set at start: one cluster per bandwidth, beside the unlimited one
        with Processes() as processes:
            url = start_disaggregated(processes, server, link_gbps=g).urls[0]
            measured = asyncio.run(
                extra_ttft(
                    Link(None, base_url, lambda: None),
                    [Link(g, url, lambda: None)],
                    args.prompt_lens,
                    args.repeats,
                    builder,
                    f"bucket-{g:g}",
                    timeout,
                    guard,
                )
            )
        merged[g] = measured.extra_s[g]
        baselines.append(measured.baseline_ttft_s)
        kv.append(measured.kv_bytes)
    per_len = range(len(args.prompt_lens))
    return ExtraTtft(
        merged,
        [statistics.median(b[i] for b in baselines) for i in per_len],
        [next((k[i] for k in kv if k[i]), None) for i in per_len],
    )


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    builder = options.prompt_builder(args)
    layers = args.num_layers or num_layers(args.model)
    server = _server(args)
    method = _link_method(args)
    bandwidths = sorted(args.gbps, reverse=True)
    foreign = ForeignCpu()
    with Processes() as references:  # the colocated instance and the unlimited pair stay up throughout
        colocated = start_colocated(references, server, 1, "separate").urls[0]
        unlimited = start_disaggregated(references, server).urls[0]
        coloc = asyncio.run(
            interference(
                colocated,
                args.prompt_lens,
                args.repeats,
                builder,
                args.background_tokens,
                args.request_timeout_s,
                QuietGuard(args.max_foreign_cpu, args.quiet_wait_s, args.max_reruns),
            )
        )
        links = _measure_links(args, builder, server, bandwidths, unlimited, method)
    result = {
        "model": args.model,
        "num_layers": layers,
        "torch_threads": args.torch_threads,
        "chunk_tokens": args.max_num_batched_tokens,
        "repeats": args.repeats,
        "link_gbps": bandwidths,
        "link_method": method,
        "prompt_len": list(args.prompt_lens),
        "crossover_gbps_measured": [],
        "crossover_gbps_model": [],
        "interference_ms": [],
        "interference_model_ms": [],
        "prefill_ms": [],
        "decode_gap_ms": [],
        "colocated_ttft_ms": [],
        "kv_bytes": links.kv_bytes,
        "extra_ttft_ms": {},
    }
    for i, n in enumerate(args.prompt_lens):
        stall, gap, prefill = coloc.stall_s[i], coloc.decode_gap_s[i], links.baseline_ttft_s[i]
        extra = [links.extra_s[g][i] for g in bandwidths]
        modelled = model_interference_s(prefill, n, args.max_num_batched_tokens - 1, gap)
        kv = links.kv_bytes[i]
        result["crossover_gbps_measured"].append(measured_crossover_gbps(bandwidths, extra, stall))
        result["crossover_gbps_model"].append(model_crossover_gbps(kv, prefill, modelled, layers) if kv else None)
        result["interference_ms"].append(stall * MS)
        result["interference_model_ms"].append(modelled * MS)
        result["prefill_ms"].append(prefill * MS)
        result["decode_gap_ms"].append(gap * MS)
        result["colocated_ttft_ms"].append(coloc.ttft_s[i] * MS)
        result["extra_ttft_ms"][str(n)] = [t * MS for t in extra]
    result["foreign_cpu"] = foreign.share()
    result["model_over_measured"] = [
        m / x if m and x else None for m, x in zip(result["crossover_gbps_model"], result["crossover_gbps_measured"])
    ]
    return result


def print_table(result: dict) -> None:
    print(
        f"crossover: model {result['model']} ({result['num_layers']} layers), {result['torch_threads']} thread(s) "
        f"per instance, prefill chunk {result['chunk_tokens']} tokens, median of {result['repeats']} probes"
    )
    print(
        f"{'prompt':>6} {'KV MiB':>7} {'prefill':>8} {'interf.':>8} {'model':>7} {'crossover measured':>19} "
        f"{'model':>7} {'model/meas.':>11}"
    )
    for i, n in enumerate(result["prompt_len"]):
        measured, modelled = result["crossover_gbps_measured"][i], result["crossover_gbps_model"][i]
        ratio = result["model_over_measured"][i]
        kv = result["kv_bytes"][i]
        print(
            f"{n:>6} {'-' if kv is None else f'{kv / 2**20:.2f}':>7} {result['prefill_ms'][i]:>6.0f}ms "
            f"{result['interference_ms'][i]:>6.0f}ms {result['interference_model_ms'][i]:>5.0f}ms "
            f"{'not reached' if measured is None else f'{measured:.3f} Gbit/s':>19} "
            f"{'-' if modelled is None else f'{modelled:.3f}':>7} {'-' if ratio is None else f'{ratio:.2f}':>11}"
        )
    print(f"other jobs used {result['foreign_cpu']:.0%} of the machine meanwhile")
    print("extra TTFT over an unlimited link (ms) per bandwidth " + " ".join(f"{g:g}" for g in result["link_gbps"]))
    for n, extra in result["extra_ttft_ms"].items():
        print(f"{n:>6}: " + " ".join(f"{t:.0f}" for t in extra))


def plot(result: dict, path: str) -> None:
    fig, (cross_ax, cost_ax) = subplots(ncols=2)
    lens = result["prompt_len"]
    for key, label, marker in (("crossover_gbps_measured", "measured", "o"), ("crossover_gbps_model", "model", "s")):
        points = [(n, g) for n, g in zip(lens, result[key]) if g]
        cross_ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, label=label)
    cross_ax.set_xscale("log", base=2)
    cross_ax.set_xticks(lens, [str(n) for n in lens])
    cross_ax.set_xlabel("prompt length (tokens)")
    cross_ax.set_ylabel("crossover KV link bandwidth (Gbit/s)")
    cross_ax.set_ylim(bottom=0)
    cross_ax.set_title("disaggregation pays above the line", fontsize=9)
    for i, n in enumerate(lens):
        line = cost_ax.plot(result["link_gbps"], result["extra_ttft_ms"][str(n)], marker="o", label=f"{n} tokens")
        cost_ax.axhline(result["interference_ms"][i], color=line[0].get_color(), linestyle=":", linewidth=1)
    cost_ax.set_xscale("log")
    cost_ax.set_yscale("symlog", linthresh=10)
    cost_ax.set_xlabel("KV link bandwidth (Gbit/s)")
    cost_ax.set_ylabel("extra TTFT (ms); dotted: interference")
    for ax in (cross_ax, cost_ax):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"crossover: {result['model']}, {result['num_layers']} layers", fontsize=10)
    save(fig, path)
