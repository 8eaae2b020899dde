"""Fencing, for every backend: the blocks of a request aborted while its sender is stalled
mid-payload go back to their owner only once no late byte can land in them, and always go back.

The sender is stopped at the `kv.mid_payload` fault point (a process peer SIGSTOPs itself; the
in-process loopback peer stalls its coroutine), the receiver aborts, and the sender resumes
later. Two-sided backends (tcp, ucx, loopback) fence at once and the blocks are reused right
away; one-sided NIXL holds them until the sender's end arrives, or until its process is known
gone.
"""

from __future__ import annotations

import asyncio

import pytest
from test_transport_conformance import (
    BACKEND_PARAMS,
    LANDED_TIMEOUT_S,
    MAIN_ID,
    PEER_ID,
    PEER_SEED,
    Env,
    assert_only_reserved_changed,
    expected_blocks,
    same_bytes,
)
from transport_peer import NUM_LAYERS

from minipd.transports import fault_points
from minipd.transports.transfer_error import TransferError

STALLED_SEED = 4
FENCE_TIMEOUT_S = 10.0
STALL_TIMEOUT_S = 3.0  # the stalled peer's own bound on a send nobody receives (ucx after a fence)
# Every other block: several runs per layer.
DST = list(range(130, 170, 2))
SRC = list(range(10, 30))


@pytest.fixture(scope="module", params=BACKEND_PARAMS)
def env(request):
    env = Env(request.param)
    yield env
    env.close()


def _stalled_peer(env: Env, name: str, tmp_path, monkeypatch):
    """A peer whose first payload stops half way (armed through the fault directory for a
    process peer, in this process for loopback)."""
    if env.backend == "loopback":
        peer = env.add_peer(name, STALLED_SEED)
        monkeypatch.setattr(fault_points, "announce", lambda point, detail: peer.faults.put_nowait(point))
        fault_points.arm("kv.mid_payload", "stall")
        return peer
    monkeypatch.setenv(fault_points.ENV_DIR, str(tmp_path))
    fault_points.write_armed(str(tmp_path), "kv.mid_payload", "stop")
    peer = env.add_peer(name, STALLED_SEED, stall_timeout_s=STALL_TIMEOUT_S)
    monkeypatch.delenv(fault_points.ENV_DIR)  # only that peer process has it
    return peer


class Fenced(list):
    """The ids an `on_fenced` callback reported, in order; `wait` until the first one comes."""

    def __init__(self):
        super().__init__()
        self._reported = asyncio.Event()

    def callback(self, request_id: str):
        def on_fenced() -> None:
            self.append(request_id)
            self._reported.set()

        return on_fenced

    async def wait(self, timeout: float) -> None:
        await asyncio.wait_for(self._reported.wait(), timeout)


async def _start_stalled_send(env: Env, peer, request_id: str) -> tuple[asyncio.Future, Fenced]:
    env.transport.expect(request_id, peer.instance_id, DST)
    send = asyncio.ensure_future(
        peer.call(
            "send", request_id=request_id, peer_id=MAIN_ID, src_ids=SRC, dst_ids=DST, layers=list(range(NUM_LAYERS))
        )
    )
    assert await asyncio.wait_for(peer.faults.get(), FENCE_TIMEOUT_S) == "kv.mid_payload"
    fenced = Fenced()
    await env.transport.abort(request_id, on_fenced=fenced.callback(request_id))
    return send, fenced


async def _send_fresh(env: Env, request_id: str) -> None:
    """Reuse the destination blocks for a request of the healthy peer."""
    env.transport.expect(request_id, PEER_ID, DST)
    await env.peer.call(
        "send", request_id=request_id, peer_id=MAIN_ID, src_ids=SRC, dst_ids=DST, layers=list(range(NUM_LAYERS))
    )
    await env.transport.wait_landed(request_id, timeout=LANDED_TIMEOUT_S)


@pytest.mark.timeout(120)
def test_aborted_blocks_are_fenced_and_late_bytes_never_land_in_them(env: Env, tmp_path, monkeypatch) -> None:
    stalled = _stalled_peer(env, "stalled-sender", tmp_path, monkeypatch)

    async def scenario():
        send, fenced = await _start_stalled_send(env, stalled, "stalled")
        if env.transport.one_sided:
            # nothing tells a one-sided receiver that the writer stopped: the blocks are held
            held_while_stalled = (list(fenced), env.transport.num_fencing)
            stalled.resume()
            await fenced.wait(FENCE_TIMEOUT_S)  # the sender's end fences them
            with pytest.raises((TransferError, asyncio.TimeoutError)):
                await env.transport.wait_landed("stalled", timeout=1)
            await asyncio.wait_for(send, LANDED_TIMEOUT_S)
            await _send_fresh(env, "fresh")
            return held_while_stalled, fenced
        await fenced.wait(FENCE_TIMEOUT_S)
        await _send_fresh(env, "fresh")  # the blocks are reused while the stalled sender is still mid-payload
        stalled.resume()
        try:
            await asyncio.wait_for(send, LANDED_TIMEOUT_S)  # its late bytes arrive now, or its send gives up
        except TransferError:
            pass
        return None, fenced

    held_while_stalled, fenced = env.run(scenario(), timeout=90)
    assert fenced == ["stalled"], "the owner got its blocks back exactly once"
    if held_while_stalled is not None:
        assert held_while_stalled == ([], 1), "a one-sided receiver released blocks a writer could still write"
    assert env.transport.num_fencing == 0
    assert same_bytes(env.pool[:, DST], expected_blocks(PEER_SEED, SRC)), "a late byte landed in reused blocks"
    assert env.transport.poll_landed() == [], "an aborted request was reported"
    assert_only_reserved_changed(env, set(DST))
    env.original.copy_(env.pool)


@pytest.mark.timeout(120)
def test_blocks_held_for_a_stalled_sender_go_back_once_it_is_known_gone(env: Env, tmp_path, monkeypatch) -> None:
    stalled = _stalled_peer(env, "frozen-sender", tmp_path, monkeypatch)

    async def scenario():
        send, fenced = await _start_stalled_send(env, stalled, "frozen")
        # it stopped answering: its pending work fails, but only two-sided receivers fence by themselves
        env.transport.peer_lost("frozen-sender", "no heartbeat", fenced=False)
        if not env.transport.one_sided:
            await fenced.wait(FENCE_TIMEOUT_S)
        after_unresponsive = list(fenced)
        stalled.kill()
        env.transport.peer_lost("frozen-sender", "its process is gone", fenced=True)
        send.cancel()
        return after_unresponsive, list(fenced)

    after_unresponsive, after_gone = env.run(scenario(), timeout=60)
    assert after_unresponsive == ([] if env.transport.one_sided else ["frozen"])
    assert after_gone == ["frozen"] and env.transport.num_fencing == 0
    env.original.copy_(env.pool)


@pytest.mark.timeout(60)
def test_a_sender_aborting_before_its_first_write_releases_the_blocks_held_for_it(env: Env) -> None:
    async def scenario():
        env.transport.expect("never-written", PEER_ID, DST)
        fenced = Fenced()
        await env.transport.abort("never-written", on_fenced=fenced.callback("never-written"))
        held = list(fenced)
        # the prefill side gives the request up before writing anything: it still says so
        await env.peer.call("abort", request_id="never-written", peer_id=MAIN_ID)
        await fenced.wait(FENCE_TIMEOUT_S)
        return held, fenced

    held, fenced = env.run(scenario())
    assert held == ([] if env.transport.one_sided else ["never-written"])
    assert fenced == ["never-written"] and env.transport.num_fencing == 0
