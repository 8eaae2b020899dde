"""The live pool scaler (minipd/ops/control_loop/pool_scaler.py) on a fake router, talking over a real
scale link (a socket pair) to a fake launcher: it adds an instance when the ratio controller
wants one and the launcher has room, has the controller switch one when it has none, and
removes an idle pool's instance only once every request routed there finished; the link's
bad input closes it with a clear error."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest
from test_placement_units import handle

from minipd.control.role import Role
from minipd.ops.control_loop.pool_scaler import LivePoolScaler
from minipd.ops.control_loop.scale_link import ScaleLink, ScaleLinkError, ScaleReply, read_call, write_reply
from minipd.policy.pool_scaling import PoolBounds, ScalingConfig
from minipd.policy.ratio_controller import CAUSE_DECODE, CAUSE_DECODE_AT_MIN, CAUSE_WITHIN_BAND, Decision, Move
from minipd.router.registry import InstanceHandle, InstanceRegistry

CONFIG = ScalingConfig(
    bounds=PoolBounds(min_prefill=1, max_prefill=2, min_decode=1, max_decode=2), idle_window_s=1.0, cooldown_s=0.0
)
WAIT_S = 10.0


class FakeLauncher:
    """The launcher's end: answers as told, and records the calls."""

    def __init__(self, registry: InstanceRegistry, room: bool):
        self.registry, self.room = registry, room
        self.calls: list[tuple[str, str | None]] = []

    async def serve(self, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        while (call := await read_call(reader)) is not None:
            self.calls.append((call.op, call.role or call.instance))
            if call.op == "hello":
                reply = ScaleReply(id=call.id, config=CONFIG)
            elif call.op == "room":
                reply = ScaleReply(id=call.id, room={"prefill": self.room, "decode": self.room})
            elif call.op == "add":
                self.registry.add(handle("decode-1", Role.DECODE))
                reply = ScaleReply(id=call.id, instance="decode-1", address="127.0.0.1:1")
            else:
                self.registry.instances[call.instance].channel.closed.set()  # its process stopped
                reply = ScaleReply(id=call.id)
            write_reply(writer, reply)
        writer.close()


async def started(room: bool, *handles):
    registry = InstanceRegistry()
    for h in handles:
        registry.add(h)
    launcher = FakeLauncher(registry, room)
    ours, theirs = socket.socketpair()
    serving = asyncio.get_running_loop().create_task(launcher.serve(theirs))
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    link = ScaleLink(reader, writer)
    assert (await link.call("hello")).config == CONFIG
    forgotten: list = []
    router = SimpleNamespace(registry=registry, links=SimpleNamespace(forget=forgotten.append, keep=forgotten.remove))
    changes: list[float] = []
    switched: list[Decision] = []
    controller = SimpleNamespace(policy=SimpleNamespace(note_pool_change=changes.append), carry_out=switched.append)
    scaler = LivePoolScaler(router, link, CONFIG, drain_timeout_s=WAIT_S)
    return SimpleNamespace(
        scaler=scaler, launcher=launcher, controller=controller, forgotten=forgotten, changes=changes,
        switched=switched, serving=serving,
    )  # fmt: skip


async def settled(scaler: LivePoolScaler) -> None:
    await asyncio.wait_for(asyncio.gather(scaler._task), WAIT_S)


class WatchedHandle(InstanceHandle):
    """An instance handle whose count of routed requests tells when a drain has looked at it:
    `looked` is set once the count was read `LOOKS` times while it drains with requests in flight
    (the drain loop reads it once a poll)."""

    LOOKS = 3

    def watch(self) -> asyncio.Event:
        self.looked, self.num_looks = asyncio.Event(), 0
        return self.looked

    @property
    def num_inflight(self) -> int:
        n = self.__dict__["num_inflight"]
        if n and self.draining and hasattr(self, "looked"):
            self.num_looks += 1
            if self.num_looks >= self.LOOKS:
                self.looked.set()
        return n

    @num_inflight.setter
    def num_inflight(self, n: int) -> None:
        self.__dict__["num_inflight"] = n


def decision(move: Move, cause: str) -> Decision:
    return Decision(0.0, move, "", 1.0, 0.2, cause)


def test_wanted_decode_with_room_adds_an_instance_instead_of_switching(loop_thread):
    async def scenario():
        s = await started(True, handle("prefill-0", Role.PREFILL), handle("decode-0", Role.DECODE))
        took_over = s.scaler.step(s.controller, 0.0, decision(Move.HOLD, CAUSE_DECODE_AT_MIN))
        await settled(s.scaler)
        await s.scaler.close()
        return s, took_over

    s, took_over = loop_thread.run(scenario())
    assert took_over and s.switched == []
    assert s.launcher.calls == [("hello", None), ("room", None), ("add", "decode")]
    [event] = s.scaler.events
    assert (event.action, event.role, event.instance, event.state) == ("add", "decode", "decode-1", "added")
    assert s.scaler.counts["add", "decode"] == 1 and len(s.changes) == 1  # the controller's window starts afresh


def test_wanted_decode_without_room_switches_one_in_place(loop_thread):
    async def scenario():
        s = await started(
            False, handle("prefill-0", Role.PREFILL), handle("prefill-1", Role.PREFILL), handle("decode-0", Role.DECODE)
        )
        wanted = decision(Move.TO_DECODE, CAUSE_DECODE)
        took_over = s.scaler.step(s.controller, 0.0, wanted)
        await settled(s.scaler)
        await s.scaler.close()
        return s, took_over, wanted

    s, took_over, wanted = loop_thread.run(scenario())
    assert took_over and s.switched == [wanted]
    assert ("add", "decode") not in s.launcher.calls and s.scaler.events == []


def test_an_idle_pool_loses_an_instance_only_once_the_requests_routed_there_finished(loop_thread):
    async def scenario():
        staying, leaving = handle("decode-0", Role.DECODE), handle("decode-1", Role.DECODE)
        leaving.__class__ = WatchedHandle  # the same handle, its count watched
        looked = leaving.watch()
        s = await started(True, handle("prefill-0", Role.PREFILL), staying, leaving)
        hold = decision(Move.HOLD, CAUSE_WITHIN_BAND)
        s.scaler.step(s.controller, 0.0, hold)  # idle from here
        s.scaler.step(s.controller, CONFIG.idle_window_s / 2, hold)
        assert s.scaler.in_flight == 0  # not idle for a whole window yet
        s.scaler.step(s.controller, CONFIG.idle_window_s, hold)
        assert s.scaler.in_flight == 1
        # requests picked both instances just before the drain began (the scaler runs next)
        staying.num_inflight = leaving.num_inflight = 1
        await asyncio.wait_for(looked.wait(), WAIT_S)  # the drain has polled the count while they run
        during = (leaving.draining, set(s.scaler.removing), list(s.launcher.calls), staying.draining)
        leaving.num_inflight = 0
        await settled(s.scaler)
        await s.scaler.close()
        return s, during

    s, (draining, removing, calls, other_draining) = loop_thread.run(scenario())
    # the newest of the least busy was drained, and nothing was stopped while its request ran
    assert draining and removing == {"decode-1"} and not other_draining
    assert ("remove", "decode-1") not in calls
    assert s.launcher.calls[-1] == ("remove", "decode-1") and s.forgotten == [("127.0.0.1", 0)]
    [event] = s.scaler.events
    assert (event.action, event.role, event.instance, event.state) == ("remove", "decode", "decode-1", "removed")
    assert s.scaler.counts["remove", "decode"] == 1 and s.scaler.removing == set() and len(s.changes) == 1


def test_a_request_that_starts_and_ends_between_two_looks_keeps_its_pool_busy(loop_thread):
    async def scenario():
        first, second = handle("decode-0", Role.DECODE), handle("decode-1", Role.DECODE)
        s = await started(True, handle("prefill-0", Role.PREFILL), first, second)
        hold = decision(Move.HOLD, CAUSE_WITHIN_BAND)
        s.scaler.step(s.controller, 0.0, hold)  # idle from here
        with second.counted():  # a short request, routed and finished between two decisions
            pass
        s.scaler.step(s.controller, CONFIG.idle_window_s, hold)  # it was busy: idle again from here
        after_short = s.scaler.in_flight
        s.scaler.step(s.controller, CONFIG.idle_window_s * 1.5, hold)  # nothing routed since: idle from here
        s.scaler.step(s.controller, CONFIG.idle_window_s * 2.5, hold)  # and for a whole window
        after_idle = s.scaler.in_flight
        await settled(s.scaler)
        await s.scaler.close()
        return after_short, after_idle

    after_short, after_idle = loop_thread.run(scenario())
    assert after_short == 0 and after_idle == 1


def test_a_malformed_reply_closes_the_link_with_a_clear_error(loop_thread):
    async def scenario():
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        link = ScaleLink(reader, writer)
        _, their_writer = await asyncio.open_unix_connection(sock=theirs)
        their_writer.write(b'{"id": 1, "config": "not a config"}\n')
        with pytest.raises(ScaleLinkError, match="the link failed"):
            await link.call("room")
        their_writer.close()
        await link.close()

    loop_thread.run(scenario())
