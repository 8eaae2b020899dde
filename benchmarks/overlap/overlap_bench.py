"""overlap: how much of the KV transfer layer-wise streaming hides behind prefill compute.

For each transport and prompt length, one request at a time through a real cluster (prefix
caching off, no local prefill), each random prompt twice: with layer-wise streaming and with
send-after-prefill. Per request the router reports the prefill compute
time and the transfer's exposed part (end of compute to the last byte acknowledged).

- compute_ms: the prefill step on the prefill instance;
- transfer_ms: moving the whole KV when nothing overlaps it (send-after-prefill: first write
  to last acknowledgement);
- exposed_ms_layerwise / exposed_ms_after: end of compute to the last acknowledgement;
- hidden_fraction = 1 - exposed_ms_layerwise / transfer_ms; the ideal is (L-1)/L, since only
  the last layer's transfer cannot overlap compute;
- ttft_ms_layerwise / ttft_ms_after: arrival at the router to the first token at the client,
  and the same minus that request's compute (the part the transfer mode can change).
Medians over `--repeats` requests per mode; the modes alternate on one cluster per transport.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import torch

from benchmarks.loadgen.baseline_plots import plot_overlap as plot  # noqa: F401 (bench.py --plot)
from minipd.engine.dtype_choice import DTYPE_CHOICES
from minipd.engine.engine import EngineConfig
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.models.arch.model_config import preset_config
from minipd.router.router_config import RouterConfig

MS = 1e3
HIDDEN_SLACK = 0.05  # the tolerance below (L-1)/L


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small", help="preset (default: %(default)s)")
    parser.add_argument("--transports", nargs="+", default=["loopback", "tcp", "ucx", "nixl"])
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--link-gbps", type=float, default=None, help="cap the prefill instance's KV egress")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPE_CHOICES,
        help="weights and KV dtype; docs/benchmarks.md's figures are float32 (default: %(default)s)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="compute threads per instance; 1 leaves a core of this 2-core machine to the transfer, "
        "as a GPU would leave the CPU free (default: %(default)s)",
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run: tiny model, loopback and tcp")


QUICK = {"model": "tiny", "transports": ["loopback", "tcp"], "prompt_lens": [256], "repeats": 1}


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    max_len = max(args.prompt_lens) + 16
    return EngineConfig.of(
        model=args.model,
        dtype=args.dtype,
        num_blocks=2 * (max_len // 16 + 2) * 2,
        max_model_len=max_len,
        max_num_batched_tokens=max_len,
        enable_prefix_caching=False,
    )


async def _measure(server, prompt_lens: list[int], repeats: int, seed: int) -> dict[int, dict[str, dict]]:
    """Per prompt length and mode, medians over `repeats` requests. The two modes alternate
    request by request (and which goes first), so drift on a shared machine hits both alike."""
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    await _one(server, [rng.randrange(256) for _ in range(64)], params, True)  # warm-up
    out = {}
    for n in prompt_lens:
        rows: dict[str, list[dict]] = {"layerwise": [], "after": []}
        for r in range(repeats):
            # One prompt for both modes, so both do the same compute (the instances run without
            # prefix caching); which mode goes first alternates.
            prompt = [rng.randrange(256) for _ in range(n)]
            for layerwise in (True, False) if r % 2 == 0 else (False, True):
                rows["layerwise" if layerwise else "after"].append(await _one(server, prompt, params, layerwise))
        out[n] = {
            mode: {k: statistics.median(row[k] for row in mode_rows) for k in mode_rows[0]}
            for mode, mode_rows in rows.items()
        }
    return out


async def _one(server, prompt: list[int], params: SamplingParams, layerwise: bool) -> dict[str, float]:
    start = time.perf_counter()
    ttft = None
    transfer = None
    async for output in server.generate(prompt, params, layerwise=layerwise):
        if output.error:
            raise RuntimeError(output.error)
        if ttft is None and output.token_ids:
            ttft = time.perf_counter() - start
        transfer = output.transfer or transfer
    if transfer is None:
        raise RuntimeError("the request was not disaggregated")
    return {
        "compute_ms": transfer.compute_s * MS,
        "transfer_ms": transfer.transfer_s * MS,
        "exposed_ms": transfer.exposed_s * MS,
        "ttft_ms": ttft * MS,
        "ttft_minus_compute_ms": (ttft - transfer.compute_s) * MS,
        "num_bytes": transfer.num_bytes,
    }


async def _run_transport(transport: str, args: argparse.Namespace, config: EngineConfig):
    router_config = RouterConfig(local_prefill_max_tokens=-1)
    if transport == "loopback":
        torch.set_num_threads(args.torch_threads)
        async with await InProcessCluster.start(config, 1, 1, router_config) as cluster:
            return await _measure(cluster, args.prompt_lens, args.repeats, seed=1)
    processes = ProcessCluster.from_argv(
        [
            "--transport",
            transport,
            "--model",
            config.model,
            "--torch-threads",
            str(args.torch_threads),
            "--dtype",
            config.dtype,
            "--num-blocks",
            str(config.num_blocks),
            "--max-model-len",
            str(config.scheduler.max_model_len),
            "--max-num-batched-tokens",
            str(config.scheduler.max_num_batched_tokens),
            "--no-prefix-caching",
            "--local-prefill-max-tokens",
            "-1",
            *(["--link-gbps", str(args.link_gbps)] if args.link_gbps else []),
        ]
    )
    await processes.start()
    try:
        client = await processes.client()
        try:
            return await _measure(client, args.prompt_lens, args.repeats, seed=1)
        finally:
            await client.close()
    finally:
        await processes.stop()


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    config = _engine_config(args)
    num_layers = preset_config(args.model).num_layers
    ideal = (num_layers - 1) / num_layers
    result = {
        "model": args.model,
        "dtype": args.dtype,
        "layers": num_layers,
        "ideal_hidden_fraction": ideal,
        "hidden_fraction_target": ideal - HIDDEN_SLACK,
        "transports": {},
    }
    for transport in args.transports:
        measured = asyncio.run(_run_transport(transport, args, config))
        rows = {}
        for n in args.prompt_lens:
            lw, af = measured[n]["layerwise"], measured[n]["after"]
            transfer_ms = af["transfer_ms"]
            rows[n] = {
                "compute_ms": lw["compute_ms"],
                "transfer_ms": transfer_ms,
                "exposed_ms_layerwise": lw["exposed_ms"],
                "exposed_ms_after": af["exposed_ms"],
                "hidden_fraction": 1 - lw["exposed_ms"] / transfer_ms if transfer_ms > 0 else 0.0,
                "ttft_ms_layerwise": lw["ttft_ms"],
                "ttft_ms_after": af["ttft_ms"],
                "ttft_minus_compute_ms_layerwise": lw["ttft_minus_compute_ms"],
                "ttft_minus_compute_ms_after": af["ttft_minus_compute_ms"],
                "kv_bytes": int(lw["num_bytes"]),
                "compute_exceeds_transfer_per_layer": lw["compute_ms"] > transfer_ms,
            }
        result["transports"][transport] = rows
    return result


def print_table(result: dict) -> None:
    ideal = result["ideal_hidden_fraction"]
    print(
        f"layer-wise KV streaming, model={result['model']} ({result['layers']} layers; ideal hidden fraction "
        f"{ideal:.3f}, target >= {ideal - HIDDEN_SLACK:.3f} where compute per layer exceeds transfer per layer)"
    )
    print(
        f"{'transport':>9} {'prompt':>6} {'KV MiB':>7} {'compute':>9} {'transfer':>9} {'exp. lw':>8} "
        f"{'exp. after':>10} {'hidden':>7} {'TTFT lw':>8} {'TTFT after':>10} {'TTFT-compute lw/after':>22}"
    )
    for transport, rows in result["transports"].items():
        for n, r in rows.items():
            print(
                f"{transport:>9} {n:>6} {r['kv_bytes'] / 2**20:>7.2f} {r['compute_ms']:>7.1f}ms "
                f"{r['transfer_ms']:>7.2f}ms {r['exposed_ms_layerwise']:>6.2f}ms {r['exposed_ms_after']:>8.2f}ms "
                f"{r['hidden_fraction']:>7.3f} {r['ttft_ms_layerwise']:>6.1f}ms {r['ttft_ms_after']:>8.1f}ms "
                f"{r['ttft_minus_compute_ms_layerwise']:>9.2f} / {r['ttft_minus_compute_ms_after']:.2f} ms"
            )
