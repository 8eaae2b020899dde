"""A try's waits on its stream (router/stream_waits.py): queued outputs come first and in order,
with no future made for them; an empty queue yields the KV's failure once it is known; the
instance's loss and the inter-token timeout raise, naming the instance; `close` leaves no
watcher behind."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from minipd.control.channel import ChannelClosed
from minipd.control.messages import KV_SIDE_DECODE, KVFailed, TokenOutput
from minipd.engine.request import RequestOutput
from minipd.router.stream_waits import StreamWaits


def _instance() -> SimpleNamespace:
    return SimpleNamespace(
        instance_id="decode-0",
        lost=asyncio.Event(),
        lost_reason="",
        channel=SimpleNamespace(closed=asyncio.Event(), close_reason=""),
    )


def _output(n: int) -> TokenOutput:
    return TokenOutput(request_id="t", output=RequestOutput(request_id="t", token_ids=[n], text="x", finished=False))


def _run(scenario):
    return asyncio.run(scenario())


def test_queued_outputs_come_first_in_order_without_a_future(monkeypatch):
    async def scenario():
        instance, outputs, fate = _instance(), asyncio.Queue(), asyncio.get_running_loop().create_future()
        waits = StreamWaits(instance, outputs, fate)
        for n in (1, 2):
            outputs.put_nowait(_output(n))
        fate.set_result(KVFailed(request_id="t", reason="late", side=KV_SIDE_DECODE))
        instance.lost.set()
        made = []
        real = asyncio.ensure_future
        monkeypatch.setattr(asyncio, "ensure_future", lambda f: made.append(f) or real(f))
        got = [(await waits.next(1.0)).output.token_ids for _ in range(2)]
        waits.close()
        return got, made

    got, made = _run(scenario)
    assert got == [[1], [2]] and made == []


def test_an_empty_stream_yields_the_kv_failure_once_it_is_known():
    async def scenario():
        fate = asyncio.get_running_loop().create_future()
        waits = StreamWaits(_instance(), asyncio.Queue(), fate)
        failed = KVFailed(request_id="t", reason="no reservation", side=KV_SIDE_DECODE)
        asyncio.get_running_loop().call_soon(fate.set_result, failed)
        try:
            return failed, await waits.next(5.0)
        finally:
            waits.close()

    failed, got = _run(scenario)
    assert got is failed


def test_the_instance_lost_first_raises_naming_it():
    async def scenario():
        instance = _instance()
        waits = StreamWaits(instance, asyncio.Queue(), None)
        instance.lost_reason = "silent past the liveness bound"
        asyncio.get_running_loop().call_soon(instance.lost.set)
        try:
            await waits.next(5.0)
        finally:
            waits.close()

    with pytest.raises(ChannelClosed, match="decode-0 died: silent past the liveness bound"):
        _run(scenario)


def test_nothing_within_the_timeout_raises_and_close_leaves_no_watcher():
    async def scenario():
        waits = StreamWaits(_instance(), asyncio.Queue(), None)
        with pytest.raises(TimeoutError, match="no output from decode-0 for 0.01 s"):
            await waits.next(0.01)
        waits.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return others, [t for t in others if not t.cancelling()]

    others, uncancelled = _run(scenario)
    assert others and uncancelled == []  # the watchers (and the last get) are all cancelled
