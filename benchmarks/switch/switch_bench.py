"""switch: an in-place role switch timed from the decision to serving in the new role.

On a local cluster of one prefill and two decode instances (`minipd --role cluster
--num-decode 2`, TCP KV, one compute thread per instance), for each model and repeat:
1. load: `--load-requests` requests with `--load-output-len`-token answers, each decoding
   (its first token received) before the switch;
2. decode-1 -> prefill by the router's admin call (`POST /admin/switch_role`) under that load.
   The router's report splits decision-to-serving (the router picks it for prefill from then
   on) into the drain (its requests finishing) and the rest: the switch itself (stop taking
   work, reset the pool, take the role, the router's handle updated);
3. right after, a burst of probe prompts: decision to the first token of the first probe that
   the switched instance prefilled, drain included (a probe's own prefill included too);
4. the same back, prefill -> decode, switched while a burst of prompts is being prefilled
   (4 x `--load-requests`; the switch once the first has its first token); the probe is the
   first request it decodes.
The table gives medians over the repeats per model and direction; the target is a switch
under 1 s excluding the drain.

    python bench.py switch --json switch.json --plot switch.png
    python bench.py switch --models tiny smollm2 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import time
import urllib.request

from benchmarks.loadgen.deployments import ServerOptions, start_disaggregated
from benchmarks.loadgen.plotting import save, subplots
from benchmarks.loadgen.processes import ManagedProcess, Processes
from minipd.engine.sampling_params import SamplingParams
from minipd.router.cluster_client import ClusterClient
from minipd.transports.shared_secret import SharedSecret

TARGET_EXCLUDING_DRAIN_S = 1.0
SWITCHED = "decode-1"
DIRECTIONS = (("decode", "prefill"), ("prefill", "decode"))
ROUTER_LINE = re.compile(r"^router: (?P<host>\S+):(?P<port>\d+)\b")
SWITCH_HTTP_TIMEOUT_S = 300.0
PREFILL_LOAD_FACTOR = 4  # prompts queued per load request when prefill is switched (a prompt is over quickly)
QUICK = {"models": ["tiny"], "repeats": 1, "load_requests": 4, "load_output_len": 16, "num_probes": 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], help="(default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="switches per direction and model")
    parser.add_argument("--load-requests", type=int, default=8, help="requests in flight at each switch")
    parser.add_argument("--load-output-len", type=int, default=48, help="tokens each load request generates")
    parser.add_argument("--prompt-len", type=int, default=192, help="tokens of every prompt (load and probes)")
    parser.add_argument("--num-probes", type=int, default=6, help="prompts of the probe burst after a switch")
    parser.add_argument("--torch-threads", type=int, default=1, help="per instance (default: 1)")
    parser.add_argument("--transport", default="tcp")
    parser.add_argument("--quick", action="store_true", help="tiny only, one repeat: seconds")


def router_address(child: ManagedProcess) -> tuple[str, int]:
    """The router's client port, from the line the cluster launcher prints before it serves."""
    for line in child.lines:
        match = ROUTER_LINE.match(line)
        if match:
            return match["host"], int(match["port"])
    raise RuntimeError(f"{child.name} printed no 'router: HOST:PORT' line")


def post_switch(url: str, instance: str, role: str) -> dict:
    request = urllib.request.Request(
        f"{url}/admin/switch_role",
        method="POST",
        data=json.dumps({"instance": instance, "role": role}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=SWITCH_HTTP_TIMEOUT_S) as response:
        return json.loads(response.read())


class Trial:
    """One cluster of one model: load, switch, probe."""

    def __init__(self, client: ClusterClient, url: str, args: argparse.Namespace):
        self.client, self.url, self.args = client, url, args
        self.vocab = client.welcome.fingerprint.model.vocab_size
        self.rng = random.Random(0)

    def prompt(self) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(self.args.prompt_len)]

    def params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    async def switch(self, role: str) -> dict:
        return await asyncio.get_running_loop().run_in_executor(None, post_switch, self.url, SWITCHED, role)

    async def _probe(self, role: str) -> float:
        """time.time() of the first token of the first probe the switched instance served as `role`."""

        async def one() -> tuple[float, object]:
            stream = self.client.submit(self.prompt(), self.params(4))
            first = await stream.__anext__()
            at = time.time()
            outputs = [first, *[o async for o in stream]]
            if outputs[-1].error is not None:
                raise RuntimeError(f"probe failed: {outputs[-1].error}")
            return at, outputs[-1].transfer

        results = await asyncio.gather(*(one() for _ in range(self.args.num_probes)))
        served = [
            at
            for at, t in results
            if t is not None and (t.prefill_instance if role == "prefill" else t.decode_instance) == SWITCHED
        ]
        return min(served) if served else float("nan")

    async def once(self, src: str, dst: str) -> dict:
        args = self.args
        if src == "decode":  # decodes in flight on every decode instance
            streams = [
                self.client.submit(self.prompt(), self.params(args.load_output_len)) for _ in range(args.load_requests)
            ]
            for stream in streams:
                await stream.__anext__()
        else:  # prompts queued for prefill: switched once the first has its first token, the rest queued
            streams = [
                self.client.submit(self.prompt(), self.params(4))
                for _ in range(PREFILL_LOAD_FACTOR * args.load_requests)
            ]
            await streams[0].__anext__()
        report = await self.switch(dst)
        first_token_at = await self._probe(dst)
        lost = 0
        for stream in streams:
            outputs = [o async for o in stream]
            lost += bool(outputs and outputs[-1].error is not None)
        return {
            "from": src,
            "to": dst,
            "total_s": report["total_s"],
            "drain_s": report["drain_s"],
            "excluding_drain_s": report["excluding_drain_s"],
            "reset_s": report["reset_s"],
            "num_drained": report["num_drained"],
            "first_token_s": first_token_at - report["decided_at"],
            "lost_requests": lost,
        }


async def _measure(address: tuple[str, int], secret: str, url: str, args: argparse.Namespace) -> list[dict]:
    client = await ClusterClient.connect(*address, secret=SharedSecret.from_text(secret))
    try:
        trial = Trial(client, url, args)
        await client.stats()
        rows = []
        for _ in range(args.repeats):
            for src, dst in DIRECTIONS:
                rows.append(await trial.once(src, dst))
        return rows
    finally:
        await client.close()


def _summary(rows: list[dict]) -> dict:
    out = {}
    for src, dst in DIRECTIONS:
        mine = [r for r in rows if r["from"] == src]
        median = {
            k: statistics.median(r[k] for r in mine)
            for k in ("total_s", "drain_s", "excluding_drain_s", "first_token_s", "reset_s")
        }
        out[f"{src}->{dst}"] = {
            **{f"median_{k}": v for k, v in median.items()},
            "max_excluding_drain_s": max(r["excluding_drain_s"] for r in mine),
            "num_drained": [r["num_drained"] for r in mine],
            "switches": len(mine),
        }
    return out


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    result = {
        "cluster": "1 prefill + 2 decode instances, minipd --role cluster",
        "switched": SWITCHED,
        "torch_threads": args.torch_threads,
        "transport": args.transport,
        "load_requests": args.load_requests,
        "load_output_len": args.load_output_len,
        "prompt_len": args.prompt_len,
        "target_excluding_drain_s": TARGET_EXCLUDING_DRAIN_S,
        "models": {},
    }
    for model in args.models:
        options = ServerOptions(
            model=model,
            torch_threads=args.torch_threads,
            transport=args.transport,
            max_model_len=args.prompt_len + max(args.load_output_len, 4) + 16,
        )
        with Processes() as processes:
            deployment = start_disaggregated(processes, options, num_prefill=1, num_decode=2)
            rows = asyncio.run(
                _measure(router_address(processes.children[-1]), processes.secret, deployment.urls[0], args)
            )
        result["models"][model] = {"switches": rows, "summary": _summary(rows)}
    worst = max(s["max_excluding_drain_s"] for m in result["models"].values() for s in m["summary"].values())
    result["max_excluding_drain_s"] = worst
    result["meets_target"] = worst < TARGET_EXCLUDING_DRAIN_S
    result["lost_requests"] = sum(r["lost_requests"] for m in result["models"].values() for r in m["switches"])
    return result


def print_table(result: dict) -> None:
    print(
        f"switch: {result['switched']} of {result['cluster']}, {result['torch_threads']} compute thread(s) each, "
        f"under a load of {result['load_requests']} requests; medians over the repeats"
    )
    print(
        f"{'model':>8} {'switch':>16} {'n':>2} {'excl. drain':>11} {'drain':>8} {'incl. drain':>11} "
        f"{'1st token':>9} {'drained':>10}"
    )
    for model, m in result["models"].items():
        for direction, s in m["summary"].items():
            print(
                f"{model:>8} {direction:>16} {s['switches']:>2} {s['median_excluding_drain_s'] * 1e3:>9.1f}ms "
                f"{s['median_drain_s']:>7.3f}s {s['median_total_s']:>10.3f}s {s['median_first_token_s']:>8.3f}s "
                f"{str(s['num_drained']):>10}"
            )
    verdict = "meets" if result["meets_target"] else "MISSES"
    print(
        f"slowest switch excluding the drain: {result['max_excluding_drain_s'] * 1e3:.1f} ms ({verdict} the "
        f"{result['target_excluding_drain_s']:g} s target); lost requests: {result['lost_requests']}"
    )


def plot(result: dict, path: str) -> None:
    fig, (ax,) = subplots(width=7.0)
    labels, series = [], {"switch, drain excluded": [], "drain included": [], "first token in the new role": []}
    for model, m in result["models"].items():
        for direction, s in m["summary"].items():
            labels.append(f"{model}\n{direction}")
            for name, key in zip(
                series, ("median_excluding_drain_s", "median_total_s", "median_first_token_s"), strict=True
            ):
                series[name].append(s[key])
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + (i - 1) * width for x in range(len(labels))], values, width, label=name)
    ax.axhline(
        result["target_excluding_drain_s"], color="grey", linestyle="--", linewidth=1, label="target (drain excluded)"
    )
    ax.set_yscale("log")
    ax.set_xticks(list(range(len(labels))), labels, fontsize=8)
    ax.set_ylabel("seconds from the decision (log)")
    ax.set_title("in-place role switch under load (medians)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    save(fig, path)
