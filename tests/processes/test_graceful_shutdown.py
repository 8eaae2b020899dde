"""SIGTERM, for every role of a process cluster: new requests are refused (or routed
elsewhere), the requests under way finish within the shutdown deadline or end with an error
saying so, everything is released, and the process exits 0."""

from __future__ import annotations

import asyncio
import signal

from disagg_helpers import ENGINE_ARGV, ROUTER_ARGV

from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.process_cluster import ProcessCluster

SHUTDOWN_S = 1.0
ROUTER_SHUTDOWN_S = 15.0  # long enough for its request to finish
EXIT_BOUND_S = ROUTER_SHUTDOWN_S + 20.0  # on a busy 2-core machine
SHORT = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=480, temperature=0.0, ignore_eos=True)  # runs for seconds: past the deadline


async def _collect(stream) -> list:
    return [output async for output in stream]


async def _until_refusing_connections(address: tuple[str, int]) -> None:
    """Wait until nothing listens at `address` any more (a draining server closed its listener)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + EXIT_BOUND_S
    while True:
        try:
            _, writer = await asyncio.open_connection(*address)
        except (ConnectionRefusedError, ConnectionResetError):  # reset: the listener closed mid-handshake
            return
        writer.close()
        assert loop.time() < deadline, f"{address} still accepts connections"
        await asyncio.sleep(0.01)  # condition poll, bounded


def _start(loop_thread, argv: list[str], shutdown_s: float = SHUTDOWN_S) -> ProcessCluster:
    cluster = ProcessCluster.from_argv(
        ["--transport", "tcp", "--shutdown-timeout-s", str(shutdown_s), *argv, *ENGINE_ARGV, *ROUTER_ARGV]
    )
    loop_thread.run(cluster.start(), timeout=180)
    return cluster


def test_sigterm_on_instances_drains_then_exits_zero(loop_thread):
    cluster = _start(loop_thread, ["--num-prefill", "1", "--num-decode", "2"])

    async def scenario():
        client = await cluster.client()
        try:
            long = client.submit(list(range(30)), LONG)
            first = await long.__anext__()
            streaming_on = next(s.instance_id for s in await client.stats() if s.num_running)
            other = next(n for n in ("decode-0", "decode-1") if n != streaming_on)
            short = client.submit(list(range(20)), SHORT)  # under way too (it may finish on either)
            cluster.child(streaming_on).process.send_signal(signal.SIGTERM)
            cluster.child("prefill-0").process.send_signal(signal.SIGTERM)
            codes = await asyncio.wait_for(
                asyncio.gather(cluster.child(streaming_on).process.wait(), cluster.child("prefill-0").process.wait()),
                EXIT_BOUND_S,
            )
            rest, short_outputs = await asyncio.wait_for(asyncio.gather(_collect(long), _collect(short)), EXIT_BOUND_S)
            after = await asyncio.wait_for(_collect(client.submit(list(range(40)), SHORT)), EXIT_BOUND_S)
            return first, rest, short_outputs, codes, after, other, await client.stats(settle=True)
        finally:
            await client.close()

    try:
        first, rest, short, codes, after, other, stats = loop_thread.run(scenario(), timeout=3 * EXIT_BOUND_S)
    finally:
        loop_thread.run(cluster.stop(), timeout=60)
    assert codes == [0, 0]
    assert first.token_ids
    assert rest[-1].finished and (rest[-1].error is None or "shut down" in rest[-1].error), rest[-1]
    assert short[-1].error is None and short[-1].num_output_tokens == SHORT.max_tokens, short[-1]
    # the next request goes to the instance left; it prefills locally (no prefill instance is left)
    assert after[-1].error is None and after[-1].num_output_tokens == SHORT.max_tokens, after[-1]
    assert [s.instance_id for s in stats] == [other] and stats[0].num_used_blocks == 0, stats


def test_sigterm_on_the_router_finishes_its_requests_then_exits_zero(loop_thread):
    cluster = _start(loop_thread, ["--num-prefill", "1", "--num-decode", "1"], ROUTER_SHUTDOWN_S)

    async def scenario():
        client = await cluster.client()
        try:
            stream = client.submit(list(range(60)), SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
            first = await stream.__anext__()
            cluster.child("router").process.send_signal(signal.SIGTERM)
            await _until_refusing_connections(cluster.router_address)
            refused = await asyncio.wait_for(_collect(client.submit(list(range(20)), SHORT)), EXIT_BOUND_S)
            rest = await asyncio.wait_for(_collect(stream), EXIT_BOUND_S)
            code = await asyncio.wait_for(cluster.child("router").process.wait(), EXIT_BOUND_S)
            return first, rest, refused, code
        finally:
            await client.close()

    try:
        first, rest, refused, code = loop_thread.run(scenario(), timeout=3 * EXIT_BOUND_S)
        instance_codes = []
        for name in ("prefill-0", "decode-0"):
            cluster.child(name).process.send_signal(signal.SIGTERM)
            instance_codes.append(loop_thread.run(cluster.child(name).process.wait(), timeout=EXIT_BOUND_S))
    finally:
        loop_thread.run(cluster.stop(), timeout=60)
    assert code == 0 and instance_codes == [0, 0]
    assert rest[-1].error is None, rest[-1]
    assert first.num_output_tokens + sum(len(o.token_ids) for o in rest) == 16
    assert refused[-1].error and "shutting down" in refused[-1].error
