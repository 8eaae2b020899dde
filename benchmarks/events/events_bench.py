"""What the request event seam costs a request: its publishes with no subscriber, and with one
subscriber of every kind, against one request through an in-process 1P+1D cluster measured in
the same run.

    python bench.py events --json events.json --plot events.png

A disaggregated request of `--max-tokens` tokens publishes about a dozen events plus one
`TokensRelayed` per streamed output (minipd/router/request_events.py); this times that
sequence of `RequestEvents.publish` calls, `--rounds` times, with no subscriber (what a request
pays when nothing observes it: one dictionary look-up a step) and with a subscriber that has a
no-op handler for every kind (every event built and delivered). The baseline is the median
wall time of `--requests` requests through an in-process cluster (`tiny`, float32, the
router, both instances and the loopback KV transfer in this process), so the ratios say what
share of a request the seam takes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time

from minipd.router import request_events
from minipd.router.request_events import EVENTS, RequestEvents, TokensRelayed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens a request streams (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=20000, help="request sequences timed (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=20, help="baseline requests (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats of each timing (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")


class _EveryKind:
    """A subscriber with a no-op handler for every kind of event."""

    def __init__(self) -> None:
        self.seen = 0
        for kind in EVENTS:
            setattr(self, kind.handler, self._count)

    def _count(self, event) -> None:
        self.seen += 1


def _arity(kind) -> int:
    return sum(
        1
        for f in dataclasses.fields(kind)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )


def _sequence(max_tokens: int) -> list[tuple]:
    """(kind, fields) of one disaggregated request's publishes, in order (fields are placeholders:
    the seam passes them through, it does not read them)."""
    kinds = [k for k in EVENTS if k is not TokensRelayed]
    steps = [(k, (None,) * _arity(k)) for k in kinds]
    relayed = (TokensRelayed, (None,) * _arity(TokensRelayed))
    return steps[:-2] + [relayed] * max_tokens + steps[-2:]


def _time_publishes(events: RequestEvents, sequence: list[tuple], rounds: int) -> float:
    """Seconds per request sequence."""
    publish = events.publish
    started = time.perf_counter()
    for _ in range(rounds):
        for kind, fields in sequence:
            publish(kind, *fields)
    return (time.perf_counter() - started) / rounds


async def _request_times(num_requests: int, max_tokens: int) -> list[float]:
    from minipd.engine.engine import EngineConfig
    from minipd.engine.sampling_params import SamplingParams
    from minipd.entrypoints.inprocess_cluster import InProcessCluster
    from minipd.router.router_config import RouterConfig

    cluster = await InProcessCluster.start(
        EngineConfig.of(model="tiny", dtype="float32", num_blocks=64, max_model_len=256),
        router_config=RouterConfig(local_prefill_max_tokens=0),
    )
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        times = []
        for n in range(num_requests + 1):  # the first warms up
            started = time.perf_counter()
            outputs = [o async for o in cluster.submit([10 + n % 200] + list(range(20, 60)), params)]
            if outputs[-1].error is not None:
                raise RuntimeError(f"a baseline request failed: {outputs[-1].error}")
            if n:
                times.append(time.perf_counter() - started)
        return times
    finally:
        await cluster.close()


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        args.rounds, args.requests, args.repeats = 2000, 5, 3
    sequence = _sequence(args.max_tokens)
    bare, subscribed = RequestEvents(), RequestEvents()
    counter = _EveryKind()
    subscribed.subscribe(counter)
    none_s, every_s = [], []
    for _ in range(args.repeats):  # alternated, so drift on a busy machine hits both alike
        none_s.append(_time_publishes(bare, sequence, args.rounds))
        every_s.append(_time_publishes(subscribed, sequence, args.rounds))
    if counter.seen != args.repeats * args.rounds * len(sequence):
        raise RuntimeError("the subscriber missed events")
    request_s = statistics.median(asyncio.run(_request_times(args.requests, args.max_tokens)))
    none, every = statistics.median(none_s), statistics.median(every_s)
    return {
        "max_tokens": args.max_tokens,
        "publishes_per_request": len(sequence),
        "event_kinds": len(request_events.EVENTS),
        "no_subscriber_us": none * 1e6,
        "every_kind_subscriber_us": every * 1e6,
        "request_ms": request_s * 1e3,
        "no_subscriber_share": none / request_s,
        "every_kind_subscriber_share": every / request_s,
        "no_subscriber_us_runs": [s * 1e6 for s in none_s],
        "every_kind_subscriber_us_runs": [s * 1e6 for s in every_s],
    }


def print_table(result: dict) -> None:
    print(
        f"the request event seam, a request of {result['max_tokens']} tokens "
        f"({result['publishes_per_request']} publishes), medians:"
    )
    none, share = result["no_subscriber_us"], result["no_subscriber_share"]
    print(f"  no subscriber             {none:7.2f} us  {share:.3%} of a request")
    print(
        f"  a subscriber of each kind {result['every_kind_subscriber_us']:7.2f} us  "
        f"{result['every_kind_subscriber_share']:.3%} of a request"
    )
    print(f"  one request through an in-process 1P+1D cluster (tiny): {result['request_ms']:.1f} ms")


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    names = ["no subscriber", "a subscriber of each kind"]
    values = [result["no_subscriber_us"], result["every_kind_subscriber_us"]]
    ax.barh(names, values, color=["#4e9a06", "#3465a4"])
    ax.set_xlabel(f"microseconds per request (one request: {result['request_ms']:.1f} ms)")
    ax.set_title("the request event seam's cost per request")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
