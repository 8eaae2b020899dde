"""The dashboard's server-sent events: the framing (and its inverse), and the hub that builds one
snapshot per tick and hands the very same bytes to every viewer."""

from __future__ import annotations

import asyncio
import json

import pytest

from minipd.ops.dashboard.sse import EVENT_SNAPSHOT, SnapshotHub, parse_sse, sse_frame


def test_one_line_payload_is_one_data_line():
    assert sse_frame(b'{"a":1}', "snapshot", "7") == b'event: snapshot\nid: 7\ndata: {"a":1}\n\n'


def test_every_payload_line_gets_its_own_data_line_and_round_trips():
    frame = sse_frame("one\ntwo\r\nthree")
    assert frame == b"data: one\ndata: two\ndata: three\n\n"
    assert parse_sse(frame) == [("message", "one\ntwo\nthree")]


def test_an_event_name_with_a_newline_is_refused():
    with pytest.raises(ValueError, match="sse event"):
        sse_frame("x", "snap\ndata: injected")


def test_parse_skips_comments_and_keeps_incomplete_events_out():
    stream = b": keep-alive\n\n" + sse_frame("1", "snapshot") + sse_frame("2", "snapshot")[:-1]
    assert parse_sse(stream) == [("snapshot", "1")]


def test_the_hub_builds_once_per_tick_and_every_viewer_gets_the_same_frame():
    builds = []

    def build() -> dict:
        builds.append(1)
        return {"n": len(builds)}

    async def scenario():
        hub = SnapshotHub(build, interval_s=60.0)  # ticks are driven by hand here
        viewers = [asyncio.ensure_future(hub.next_frame(0, timeout=10)) for _ in range(64)]
        await asyncio.sleep(0)  # every viewer is waiting
        await hub.tick()
        frames = await asyncio.gather(*viewers)
        assert len(builds) == 1
        assert len({id(frame) for _, frame in frames}) == 1  # one encoding, shared
        (event,) = parse_sse(frames[0][1])
        assert event[0] == EVENT_SNAPSHOT and json.loads(event[1]) == {"n": 1}
        assert frames[0][0] == 1
        # a viewer that saw version 1 waits for the next; none comes within its timeout
        assert await hub.next_frame(1, timeout=0.05) == (1, None)
        # closing releases a waiting viewer at once
        waiting = asyncio.ensure_future(hub.next_frame(1, timeout=10))
        await asyncio.sleep(0)
        await hub.close()
        assert await asyncio.wait_for(waiting, 1) == (1, None) and hub.closed

    asyncio.run(scenario())


def test_a_failing_build_does_not_stop_the_ticks():
    calls = []

    def build() -> dict:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return {"ok": True}

    async def scenario():
        hub = SnapshotHub(build, interval_s=0.01)
        hub.start()
        _, frame = await hub.next_frame(0, timeout=5)
        await hub.close()
        assert frame is not None and json.loads(parse_sse(frame)[0][1]) == {"ok": True}

    asyncio.run(scenario())
