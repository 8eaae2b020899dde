"""A KV that will not land leaves an instance one way: one `KVFailed` naming the request and the
side that saw it, and nothing else for that request (no CallError, no failed TokenOutput, no
KVLanded). Each origin is driven here on the role handlers over stand-ins: the prefill's
transfer failing, the decode instance giving a reservation up (its lease expired), and a
Decode whose KV did not load (the reservation gone, or the landing failed)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from minipd.control.messages import (
    KV_SIDE_DECODE,
    KV_SIDE_PREFILL,
    Decode,
    Fingerprint,
    KVFailed,
    Message,
    Prefill,
)
from minipd.control.role import Role
from minipd.disagg.decode_role import DecodeRole
from minipd.disagg.prefill_role import PrefillRole
from minipd.disagg.reservations import Reservation
from minipd.disagg.role_switch import InFlightWork
from minipd.engine.sampling_params import SamplingParams
from minipd.transports.transfer_error import TransferError

SAMPLING = SamplingParams(max_tokens=1)


class _Channel:
    name = "router"

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def reply(self, call, reply) -> None:
        self.sent.append(reply)

    def send(self, message: Message) -> None:
        self.sent.append(message)


class _Transport:
    """Connecting fails, and so does waiting for a landing: the KV does not move."""

    async def connect(self, description: bytes) -> str:
        raise TransferError("decode-0", "", "link down")

    async def wait_landed(self, request_id: str, timeout: float):
        raise TransferError("prefill-0", request_id, "the sender aborted")


class _Reservations:
    def __init__(self, held: Reservation | None) -> None:
        self.held, self.released = held, []

    def take(self, request_id: str) -> Reservation | None:
        held, self.held = self.held, None
        return held

    async def release(self, request_id: str, block_ids: list[int]) -> None:
        self.released.append((request_id, block_ids))


FINGERPRINT = Fingerprint(protocol_version=0, model=None, weights_digest="", dtype="", block_size=16, kv_layout="")


def _instance(reservations: _Reservations | None = None) -> SimpleNamespace:
    """What the role handlers use of an instance, recording what it tracks and aborts."""
    tracked: set[str] = set()
    aborted: list[str] = []
    return SimpleNamespace(
        instance_id="inst-0",
        role=Role.BOTH,
        lease_s=2.0,
        tracked=tracked,
        track=lambda channel, request_id: tracked.add(request_id),
        untrack=lambda channel, request_id: tracked.discard(request_id),
        guard=SimpleNamespace(work=InFlightWork()),
        transport=_Transport(),
        reservations=reservations,
        expired_leases=asyncio.Queue(),
        fingerprint=FINGERPRINT,  # the decode instance's too: compatible
        tier_wire=None,
        engine=SimpleNamespace(model_config=SimpleNamespace(num_layers=2), aborted=aborted, abort=aborted.append),
    )


def _reservation(channel: _Channel) -> Reservation:
    return Reservation(token_ids=[1, 2], block_ids=[5, 6], num_cached_tokens=0, deadline=0.0, channel=channel)


def test_a_prefill_whose_kv_does_not_move_answers_kv_failed_in_place_of_its_reply():
    instance, channel = _instance(), _Channel()
    message = Prefill(
        request_id="t1",
        call_id=3,
        token_ids=[1, 2],
        sampling=SAMPLING,
        decode_instance="decode-0",
        decode_description=b"",
        decode_fingerprint=FINGERPRINT,
        dst_block_ids=[5],
        num_skip_blocks=0,
    )
    asyncio.run(PrefillRole(instance).prefill(channel, message))
    [report] = channel.sent
    assert isinstance(report, KVFailed)  # a message of its own, no reply: the router's dispatch takes it
    assert (report.request_id, report.side) == ("t1", KV_SIDE_PREFILL) and "link down" in report.reason
    assert instance.tracked == set() and len(instance.guard.work) == 0 and instance.engine.aborted == ["t1"]


def test_a_reservation_given_up_is_reported_as_kv_failed_on_its_connection():
    instance, channel = _instance(), _Channel()
    instance.guard.work.hold("t2")
    instance.track(channel, "t2")
    DecodeRole(instance).lease_expired("t2", _reservation(channel))
    assert channel.sent == [
        KVFailed(
            request_id="t2",
            reason="the reservation on inst-0 expired: no prefill progress for 2.0 s",
            side=KV_SIDE_DECODE,
        )
    ]
    assert instance.tracked == set() and len(instance.guard.work) == 0
    assert instance.expired_leases.get_nowait() == "t2"


def test_a_decode_without_its_reservation_answers_kv_failed_and_no_stream():
    instance, channel = _instance(_Reservations(None)), _Channel()
    instance.guard.work.hold("t3")
    asyncio.run(DecodeRole(instance).decode(channel, Decode(request_id="t3", first_token=1, sampling=SAMPLING)))
    [report] = channel.sent
    assert isinstance(report, KVFailed) and (report.request_id, report.side) == ("t3", KV_SIDE_DECODE)
    assert "holds no reservation" in report.reason and len(instance.guard.work) == 0


def test_a_decode_whose_kv_did_not_land_frees_the_blocks_and_answers_kv_failed_alone():
    channel = _Channel()
    reservations = _Reservations(_reservation(channel))
    instance = _instance(reservations)
    instance.guard.work.hold("t4")
    asyncio.run(DecodeRole(instance).decode(channel, Decode(request_id="t4", first_token=1, sampling=SAMPLING)))
    [report] = channel.sent  # no KVLanded, no failed output: the one report
    assert isinstance(report, KVFailed) and (report.request_id, report.side) == ("t4", KV_SIDE_DECODE)
    assert report.reason.startswith("the KV did not load: ") and "the sender aborted" in report.reason
    assert reservations.released == [("t4", [5, 6])] and len(instance.guard.work) == 0
