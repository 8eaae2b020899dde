"""crossover: per prompt length, the KV link bandwidth at which disaggregation stops paying.

Disaggregation adds the exposed KV transfer to a prompt's TTFT and removes that prompt's
prefill from the steps of the decodes running beside it. For each prompt length P:

1. interference (one colocated instance): a long decode stream runs; probes of P tokens are
   prefilled beside it one at a time; I(P) is the time the stream loses per probe (its gaps
   overlapping the prefill, less its undisturbed gap), median over `--repeats`;
2. transfer cost (1 prefill + 1 decode instance, one cluster per `--gbps` value and one with
   an unlimited link): the probe's TTFT on a link of B minus its TTFT unlimited;
3. measured crossover: where that extra TTFT reaches I(P), going from generous to starved
   (interpolated in 1/B); modelled crossover: where the layer-wise transfer model
   (benchmarks/loadgen/crossover_model.py) exposes I(P), from the KV bytes the router
   counted, the prefill time and the layer count, against the modelled interference.
Below the crossover the link costs a prompt more than colocation costs its neighbours.

    python bench.py crossover --model small --json crossover.json --plot crossover.png
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

import aiohttp

from benchmarks.loadgen import options
from benchmarks.loadgen.client import served_model
from benchmarks.loadgen.crossover_model import (measured_crossover_gbps, model_crossover_gbps,
                                                model_interference_s, stall_s)
from benchmarks.loadgen.deployments import ServerOptions, start_colocated, start_disaggregated
from benchmarks.loadgen.host_load import ForeignCpu
from benchmarks.loadgen.model_facts import num_layers
from benchmarks.loadgen.plotting import save, subplots
from benchmarks.loadgen.probes import DecodeStream, probe_ttft, warm_up_and_calibrate
from benchmarks.loadgen.processes import Processes
from benchmarks.loadgen.server_metrics import transfer_totals

MS = 1e3
DEFAULT_PROMPT_LENS = (256, 512, 1024, 2048)
DEFAULT_GBPS = (2.0, 0.5, 0.25, 0.15, 0.1, 0.07, 0.05)
DEFAULT_CHUNK_TOKENS = 512
BACKGROUND_PROMPT_LEN = 32
SETTLE_TOKENS = 4  # decode tokens between probes, so each probe finds the stream undisturbed
WARM_TOKENS = 16
QUICK = {"model": "tiny", "prompt_lens": [512, 1024], "gbps": [0.03], "repeats": 2,
         "background_tokens": 400}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_client_arguments(parser)
    options.add_server_arguments(parser)
    parser.set_defaults(max_num_batched_tokens=DEFAULT_CHUNK_TOKENS)
    g = parser.add_argument_group("crossover")
    g.add_argument("--prompt-lens", type=int, nargs="+", default=list(DEFAULT_PROMPT_LENS))
    g.add_argument("--gbps", type=float, nargs="+", default=list(DEFAULT_GBPS),
                   help="KV link bandwidths of the sweep, Gbit/s (default: %(default)s)")
    g.add_argument("--repeats", type=int, default=3, help="probes per prompt length and link (median)")
    g.add_argument("--background-tokens", type=int, default=1024, help="length of the decode stream")
    g.add_argument("--num-layers", type=int, default=None, help="layers of the model (default: read from --model)")
    g.add_argument("--tokenizer", default=None, help="as for the other experiments (default: from --model)")
    g.add_argument("--seed", type=int, default=0)


async def _interference(url: str, args: argparse.Namespace, builder) -> dict:
    """Per prompt length: median stall of the decode stream, and the undisturbed gap."""
    out = {"interference_s": [], "decode_gap_s": [], "colocated_ttft_s": []}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        model = await served_model(session, url)
        await warm_up_and_calibrate(session, url, model, builder, args.prompt_lens[0], args.request_timeout_s)
        for n in args.prompt_lens:
            background = builder.prompt(f"background-{n}", 0, BACKGROUND_PROMPT_LEN)
            async with DecodeStream(session, url, model, background, args.background_tokens) as stream:
                await stream.wait_for_tokens(WARM_TOKENS)
                windows = []
                for r in range(args.repeats):
                    windows.append(await probe_ttft(session, url, model, builder.prompt(f"coloc-{n}", r, n), n,
                                                    args.request_timeout_s))
                    await stream.wait_for_tokens(SETTLE_TOKENS)
                times = list(stream.times)
            gaps = [b - a for a, b in zip(times, times[1:]) if not any(a < end and b > start for start, end in windows)]
            gap = statistics.median(gaps)
            out["decode_gap_s"].append(gap)
            out["interference_s"].append(statistics.median(stall_s(times, s, e, gap) for s, e in windows))
            out["colocated_ttft_s"].append(statistics.median(e - s for s, e in windows))
    return out


async def _ttfts(url: str, args: argparse.Namespace, builder, tag: str) -> tuple[list[float], list[float | None]]:
    """Per prompt length: median probe TTFT, and the KV bytes per transfer the router counted."""
    ttfts, kv_bytes = [], []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        model = await served_model(session, url)
        await warm_up_and_calibrate(session, url, model, builder, args.prompt_lens[0], args.request_timeout_s)
        for n in args.prompt_lens:
            before = transfer_totals(url)
            samples = []
            for r in range(args.repeats):
                start, first = await probe_ttft(session, url, model, builder.prompt(f"{tag}-{n}", r, n), n,
                                                args.request_timeout_s)
                samples.append(first - start)
            after = transfer_totals(url)
            ttfts.append(statistics.median(samples))
            kv_bytes.append(after.since(before).bytes_per_transfer if before and after else None)
    return ttfts, kv_bytes


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    args.request_rate = None
    builder = options.prompt_builder(args)
    layers = args.num_layers or num_layers(args.model)
    max_len = max(max(args.prompt_lens), BACKGROUND_PROMPT_LEN + args.background_tokens) + options.SPECIAL_TOKENS_MARGIN
    server = ServerOptions(model=args.model, torch_threads=args.torch_threads, max_model_len=-(-max_len // 16) * 16,
                           num_blocks=args.num_blocks, max_num_batched_tokens=args.max_num_batched_tokens,
                           transport=args.transport, extra_flags=tuple(args.server_flag))
    foreign = ForeignCpu()
    with Processes() as processes:
        deployment = start_colocated(processes, server, 1, "separate")
        coloc = asyncio.run(_interference(deployment.urls[0], args, builder))
    bandwidths = sorted(args.gbps, reverse=True)
    runs = {}
    for gbps in [None, *bandwidths]:
        with Processes() as processes:
            deployment = start_disaggregated(processes, server, link_gbps=gbps)
            runs[gbps] = asyncio.run(_ttfts(deployment.urls[0], args, builder, f"disagg-{gbps}"))
    base_ttft, kv_bytes = runs[None]
    result = {"model": args.model, "num_layers": layers, "torch_threads": args.torch_threads,
              "chunk_tokens": args.max_num_batched_tokens, "repeats": args.repeats, "link_gbps": bandwidths,
              "prompt_len": list(args.prompt_lens), "crossover_gbps_measured": [], "crossover_gbps_model": [],
              "interference_ms": [], "interference_model_ms": [], "prefill_ms": [], "decode_gap_ms": [],
              "colocated_ttft_ms": [], "kv_bytes": [], "extra_ttft_ms": {}}
    for i, n in enumerate(args.prompt_lens):
        interference, gap = coloc["interference_s"][i], coloc["decode_gap_s"][i]
        extra = [runs[g][0][i] - base_ttft[i] for g in bandwidths]
        prefill = base_ttft[i]
        modelled = model_interference_s(prefill, n, args.max_num_batched_tokens - 1, gap)
        kv = kv_bytes[i] or next((runs[g][1][i] for g in bandwidths if runs[g][1][i]), None)
        result["crossover_gbps_measured"].append(measured_crossover_gbps(bandwidths, extra, interference))
        result["crossover_gbps_model"].append(model_crossover_gbps(kv, prefill, modelled, layers) if kv else None)
        result["interference_ms"].append(interference * MS)
        result["interference_model_ms"].append(modelled * MS)
        result["prefill_ms"].append(prefill * MS)
        result["decode_gap_ms"].append(gap * MS)
        result["colocated_ttft_ms"].append(coloc["colocated_ttft_s"][i] * MS)
        result["kv_bytes"].append(kv)
        result["extra_ttft_ms"][str(n)] = [t * MS for t in extra]
    result["foreign_cpu"] = foreign.share()
    result["model_over_measured"] = [m / x if m and x else None for m, x in
                                     zip(result["crossover_gbps_model"], result["crossover_gbps_measured"])]
    return result


def print_table(result: dict) -> None:
    print(f"crossover: model {result['model']} ({result['num_layers']} layers), {result['torch_threads']} thread(s) "
          f"per instance, prefill chunk {result['chunk_tokens']} tokens, median of {result['repeats']} probes")
    print(f"{'prompt':>6} {'KV MiB':>7} {'prefill':>8} {'interf.':>8} {'model':>7} {'crossover measured':>19} "
          f"{'model':>7} {'model/meas.':>11}")
    for i, n in enumerate(result["prompt_len"]):
        measured, modelled = result["crossover_gbps_measured"][i], result["crossover_gbps_model"][i]
        ratio = result["model_over_measured"][i]
        kv = result["kv_bytes"][i]
        print(f"{n:>6} {'-' if kv is None else f'{kv / 2**20:.2f}':>7} {result['prefill_ms'][i]:>6.0f}ms "
              f"{result['interference_ms'][i]:>6.0f}ms {result['interference_model_ms'][i]:>5.0f}ms "
              f"{'not reached' if measured is None else f'{measured:.3f} Gbit/s':>19} "
              f"{'-' if modelled is None else f'{modelled:.3f}':>7} {'-' if ratio is None else f'{ratio:.2f}':>11}")
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
