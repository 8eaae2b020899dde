"""soak: a mixed workload through a local process cluster while its processes are paused and killed.

Requests of the `mixed` workload (long prompts with short answers, short prompts with long
answers) arrive by a Poisson process; every `--chaos-interval-s` one fault, by turns (see
benchmarks/soak/chaos.py): the router paused (SIGSTOP) past the liveness bound, an instance
paused past it until the router declared it lost, an instance killed (kill -9). Nothing
is done by hand to recover: the cluster's membership heals by itself after a pause, and the
launcher's `Supervisor` (run beside the soak, as `minipd --role cluster` runs it) restarts a
killed child. Each fault's `recovery_s` is the time from its end (the SIGCONT, the kill)
until the cluster served at full capacity again: every instance listed alive by the router
and a probe request sent after that completed (benchmarks/soak/recovery.py). A fault not
recovered from within its bound fails the run (exit status 1), as does a supervisor that
gave up. The faults keep coming, after the load if need be, until each kind ran once.
Every request ends one of three ways:

- completed: every token it asked for, no error;
- failed: it ended early with an error saying why (e.g. the decode instance streaming it died);
- lost: it did not end within `--request-timeout-s`, or ended early without saying why.
  Must be 0.

Afterwards every instance is given the time to settle, and `leaked_blocks` counts the blocks
still used, reserved or held for a fence on any of them. Must be 0.

Memory: the resident set (VmRSS) of every process of the cluster is read when it is up and
again after the settle (`rss_mb`, see benchmarks/soak/rss.py); `rss_growth_mb` is the largest
growth of a process that ran the whole soak (a killed one is restarted as a new process, and
its figures say so). More than `--max-rss-growth-mb` fails the run (exit status 1), as an
engine whose memory grows with every distinct prompt length would. The instances serve
bfloat16 by default (`--dtype`), whose per-shape kernel caches were such a growth.
`--quick` is the short run the test suite makes.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import random
import re
import statistics
import tempfile
import time

from benchmarks.loadgen.baseline_plots import plot_soak as plot  # noqa: F401 (bench.py --plot)
from benchmarks.soak import rss
from benchmarks.soak.chaos import Chaos
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.entrypoints.supervisor import Supervisor
from minipd.ops.workload import ArrivalProcess, RequestSpec, make_workload
from minipd.router.cluster_client import ClusterClient

SETTLE_S = 60.0  # after the run, every pool must be full again within this
QUICK = {"duration_s": 16.0, "chaos_interval_s": 2.0, "rate": 2.0}
VOCAB = 256  # the tiny preset's byte tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration-s", type=float, default=180.0, help="how long requests arrive (default: %(default)s)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a short run for CI: {QUICK['duration_s']:.0f} s, a fault every {QUICK['chaos_interval_s']:.0f} s",
    )
    parser.add_argument("--rate", type=float, default=2.0, help="requests per second (default: %(default)s)")
    parser.add_argument(
        "--chaos-interval-s", type=float, default=15.0, help="one pause or kill this often (default: %(default)s)"
    )
    parser.add_argument("--transport", default="tcp", choices=["tcp", "ucx", "nixl"])
    parser.add_argument("--num-prefill", type=int, default=2)
    parser.add_argument("--num-decode", type=int, default=2)
    parser.add_argument(
        "--liveness-timeout-s",
        type=float,
        default=3.0,
        help="the cluster's liveness bound; every pause lasts longer (default: %(default)s)",
    )
    parser.add_argument("--lease-s", type=float, default=3.0)
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        default=90.0,
        help="a request not ended by then counts as lost (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float32"],
        help="the instances' dtype (default: %(default)s)",
    )
    parser.add_argument(
        "--max-rss-growth-mb",
        type=float,
        default=rss.DEFAULT_MAX_GROWTH_MB,
        help="fail if a process's resident memory grew more than this over the run (default: %(default)s)",
    )


def _cluster_argv(args: argparse.Namespace) -> list[str]:
    return [
        "--transport",
        args.transport,
        "--num-prefill",
        str(args.num_prefill),
        "--num-decode",
        str(args.num_decode),
        "--liveness-timeout-s",
        str(args.liveness_timeout_s),
        "--lease-s",
        str(args.lease_s),
        "--dtype",
        args.dtype,
        "--max-model-len",
        "1100",
        "--num-blocks",
        "512",
        "--max-num-batched-tokens",
        "512",
        "--shutdown-timeout-s",
        "2",
        "--torch-threads",
        "1",
    ]


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if args.max_rss_growth_mb <= 0:
        raise ValueError(f"--max-rss-growth-mb must be positive, got {args.max_rss_growth_mb:g}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    return asyncio.run(_soak(args))


async def _soak(args: argparse.Namespace) -> dict:
    specs = make_workload(
        "mixed", max(1, round(args.rate * args.duration_s)), ArrivalProcess.poisson(args.rate), seed=args.seed
    )
    with tempfile.TemporaryDirectory() as fault_dir:
        cluster = ProcessCluster.from_argv(_cluster_argv(args), fault_dir=fault_dir)
        await cluster.start()
        try:
            rss_start = rss.sample(cluster)
            client = await cluster.client()
            supervisor = asyncio.create_task(Supervisor(cluster, cluster.configs.cluster).run())
            try:
                chaos = Chaos(cluster, client, args.liveness_timeout_s, args.chaos_interval_s, args.seed)
                stop = asyncio.Event()
                chaos_task = asyncio.create_task(chaos.run(stop))
                start = time.monotonic()
                outcomes = await asyncio.gather(*(_one(client, spec, i, start, args) for i, spec in enumerate(specs)))
                stop.set()
                await chaos_task
                stats = await _settled(cluster)
                rss_end = rss.sample(cluster)
            finally:
                supervisor.cancel()  # before the stop: a child stopped on purpose is not restarted
                given_up = await asyncio.gather(supervisor, return_exceptions=True)
            await client.close()
        finally:
            await cluster.stop()
    result = _result(args, specs, outcomes, stats, chaos) | rss.report(rss_start, rss_end, args.max_rss_growth_mb)
    result["checks_failed"] += [str(e) for e in given_up if isinstance(e, Exception)]
    result["checks_failed"] += [f"{e.kind} of {e.target}: {e.error}" for e in chaos.events if e.recovery_s is None]
    return result


async def _one(client: ClusterClient, spec: RequestSpec, index: int, start: float, args: argparse.Namespace) -> tuple:
    await asyncio.sleep(max(0.0, start + spec.arrival_s - time.monotonic()))  # the arrival time
    rng = random.Random(args.seed * 1_000_003 + index)
    prompt = [rng.randrange(VOCAB) for _ in range(spec.prompt_len)]
    params = SamplingParams(max_tokens=spec.output_len, temperature=0.0, ignore_eos=True)
    tokens = 0
    try:
        async with asyncio.timeout(args.request_timeout_s):
            async for output in client.generate(prompt, params):
                tokens += len(output.token_ids)
                if output.finished:
                    if output.error is None and tokens == spec.output_len:
                        return "completed", None
                    if output.error:
                        return "failed", output.error
                    return "lost", f"ended after {tokens} of {spec.output_len} tokens without an error"
    except TimeoutError:
        return "lost", f"no end within {args.request_timeout_s} s"
    return "lost", "the stream ended without a final output"


async def _settled(cluster: ProcessCluster) -> list:
    client = await cluster.client()
    try:
        deadline = time.monotonic() + SETTLE_S
        while True:
            stats = await client.stats(settle=True)
            names = sorted(c.name for c in cluster.children if c.name != "router")
            if (
                sorted(s.instance_id for s in stats) == names and not any(_held(s) for s in stats)
            ) or time.monotonic() > deadline:
                return stats
            await asyncio.sleep(0.5)  # stragglers (a stalled sender, a fence) finish on their own clocks
    finally:
        await client.close()


def _held(stats) -> int:
    return stats.num_used_blocks + stats.num_fencing_blocks + stats.num_reservations


def _result(args, specs, outcomes, stats, chaos: Chaos) -> dict:
    counts = collections.Counter(kind for kind, _ in outcomes)
    # errors with instance names and numbers folded together, most common first
    errors = collections.Counter(re.sub(r"\d+(\.\d+)?", "N", e) for kind, e in outcomes if kind == "failed")
    lost = [e for kind, e in outcomes if kind == "lost"]
    return {
        "transport": args.transport,
        "dtype": args.dtype,
        "duration_s": args.duration_s,
        "rate": args.rate,
        "quick": args.quick,
        "instances": {"prefill": args.num_prefill, "decode": args.num_decode},
        "requests": len(specs),
        "completed": counts["completed"],
        "failed": counts["failed"],
        "lost": len(lost),
        "lost_examples": lost[:5],
        "failure_reasons": dict(errors.most_common(8)),
        "leaked_blocks": sum(_held(s) for s in stats),
        "instances_after": {
            s.instance_id: {"used": s.num_used_blocks, "reserved": s.num_reservations, "fencing": s.num_fencing_blocks}
            for s in stats
        },
        "chaos": [event._asdict() for event in chaos.events],
        "recovery_s": _recovery_by_kind(chaos),
    }


def _recovery_by_kind(chaos: Chaos) -> dict:
    """Per fault kind: how many, and the median and worst time to full capacity (None: never)."""
    by_kind = {}
    for kind in sorted({e.kind for e in chaos.events}):
        times = [e.recovery_s for e in chaos.events if e.kind == kind]
        done = sorted(t for t in times if t is not None)
        by_kind[kind] = {
            "faults": len(times),
            "median_s": statistics.median(done) if done else None,
            "max_s": max(done) if len(done) == len(times) else None,
        }
    return by_kind


def print_table(result: dict) -> None:
    print(
        f"soak: {result['requests']} requests over {result['duration_s']:.0f} s ({result['transport']}, "
        f"{result['instances']['prefill']} prefill + {result['instances']['decode']} decode), "
        f"{len(result['chaos'])} faults"
    )
    print(f"{'completed':>10} {'failed':>7} {'lost':>5} {'leaked blocks':>14}")
    print(f"{result['completed']:>10} {result['failed']:>7} {result['lost']:>5} {result['leaked_blocks']:>14}")
    print(f"  {'at':>7}    {'fault':<15} {'target':<10} {'lasted':>7} {'full capacity after':>20}")
    for event in result["chaos"]:
        back = "NEVER" if event["recovery_s"] is None else f"{event['recovery_s']:.2f} s"
        dropped = " (declared lost)" if event["dropped"] else ""
        print(
            f"  {event['at_s']:>7.1f} s  {event['kind']:<15} {event['target']:<10} "
            f"{event['fault_s']:>5.1f} s {back:>20}{dropped}"
        )
    rss.print_table(result)
    for reason, n in result["failure_reasons"].items():
        print(f"  failed x{n}: {reason}")
    for example in result["lost_examples"]:
        print(f"  LOST: {example}")
