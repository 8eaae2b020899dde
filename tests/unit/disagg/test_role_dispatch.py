"""The instance's dispatch of work messages to its role handlers: what each role takes, and the
one refusal of a work message the current role does not take (a call's CallError "invalid", a
Decode's `KVFailed`) naming the instance, its role and the message; the
admission checks (role epoch) come before it, and a role switch changes the handler."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from minipd.control.messages import (
    KV_SIDE_DECODE,
    STALE_EPOCH,
    CallError,
    Decode,
    Fingerprint,
    Generate,
    Heartbeat,
    KVFailed,
    Message,
    Prefill,
    Reserve,
)
from minipd.control.role import INSTANCE_ROLES, Role
from minipd.disagg import instance as instance_module
from minipd.disagg.colocated_role import ColocatedRole
from minipd.disagg.decode_role import DecodeRole
from minipd.disagg.instance import Instance
from minipd.disagg.prefill_role import PrefillRole
from minipd.disagg.role_handler import ROLE_MESSAGES
from minipd.engine.sampling_params import SamplingParams

EXPECTED = {
    Role.PREFILL: {Prefill, Generate},
    Role.DECODE: {Reserve, Decode, Generate},
    Role.BOTH: {Prefill, Reserve, Decode, Generate},
}


class _Channel:
    """Records what the instance answers (replies and sent messages alike)."""

    name = "test"

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def reply(self, call, reply) -> None:
        reply.call_id, reply.request_id = call.call_id, call.request_id
        self.sent.append(reply)

    def send(self, message: Message) -> None:
        self.sent.append(message)


def _instance(monkeypatch, role: Role) -> tuple[Instance, list[tuple[str, Message]]]:
    """An instance of `role` on stand-ins (no engine runs: nothing here gets that far), whose
    handlers record what they are handed instead of serving it."""
    monkeypatch.setattr(instance_module, "engine_fingerprint", lambda engine: None)
    engine = SimpleNamespace(config=SimpleNamespace(device="test:0"), placement=None)
    instance = Instance(engine, role, "inst-0", transport=None, model_name="m")
    handled: list[tuple[str, Message]] = []
    for handler in instance._handlers.values():

        async def record(channel, message, _role=handler.role):
            handled.append((_role.value, message))

        monkeypatch.setattr(handler, "handle", record)
    return instance, handled


def _messages(epoch: int | None = None) -> dict[type, Message]:
    sampling = SamplingParams(max_tokens=1)
    fingerprint = Fingerprint(protocol_version=0, model=None, weights_digest="", dtype="", block_size=16, kv_layout="")
    return {
        Reserve: Reserve(request_id="r", call_id=1, token_ids=[1], prefill_instance="p", epoch=epoch),
        Prefill: Prefill(
            request_id="p",
            call_id=2,
            token_ids=[1],
            sampling=sampling,
            decode_instance="d",
            decode_description=b"",
            decode_fingerprint=fingerprint,
            dst_block_ids=[],
            num_skip_blocks=0,
            epoch=epoch,
        ),
        Decode: Decode(request_id="d", first_token=1, sampling=sampling),
        Generate: Generate(request_id="g", token_ids=[1], sampling=sampling, epoch=epoch),
    }


def test_each_role_declares_the_work_it_takes():
    handlers = {h.role: h for h in (PrefillRole(None), DecodeRole(None))}
    handlers[Role.BOTH] = ColocatedRole(handlers[Role.PREFILL], handlers[Role.DECODE])
    assert {role: set(h.accepts) for role, h in handlers.items()} == EXPECTED
    assert set(handlers) == set(INSTANCE_ROLES)
    assert set().union(*EXPECTED.values()) == set(ROLE_MESSAGES)


@pytest.mark.parametrize("role", INSTANCE_ROLES, ids=lambda r: r.value)
def test_a_role_gets_what_it_takes_and_the_rest_is_refused_in_one_shape(monkeypatch, role):
    instance, handled = _instance(monkeypatch, role)
    assert instance.handler.role is role
    for kind, message in _messages().items():
        channel = _Channel()
        asyncio.run(instance.handle(channel, message))
        if kind in EXPECTED[role]:
            assert handled[-1] == (role.value, message) and channel.sent == []
            continue
        assert all(m is not message for _, m in handled), f"{kind.__name__} reached the {role.value} handler"
        [answer] = channel.sent
        takes = ", ".join(k.__name__ for k in instance.handler.accepts)
        reason = f"inst-0 is a {role.value} instance; it does not take {kind.__name__} (it takes {takes})"
        if kind is Decode:  # no reservation here: the one report of KV that did not load, no stream
            assert answer == KVFailed(request_id=message.request_id, reason=reason, side=KV_SIDE_DECODE)
        else:  # a call: its reply
            assert answer == CallError(
                message=reason, kind="invalid", request_id=message.request_id, call_id=message.call_id
            )


def test_a_stale_epoch_is_answered_before_the_role_refusal(monkeypatch):
    instance, handled = _instance(monkeypatch, Role.PREFILL)
    channel = _Channel()
    asyncio.run(instance.handle(channel, _messages(epoch=7)[Reserve]))
    [answer] = channel.sent
    assert isinstance(answer, CallError) and answer.kind == STALE_EPOCH and handled == []


def test_a_role_switch_changes_the_handler(monkeypatch):
    instance, handled = _instance(monkeypatch, Role.DECODE)
    messages = _messages()

    async def scenario():
        await instance.guard.switch(Role.PREFILL, 0, 1.0, reset=_nothing)
        before = _Channel()
        await instance.handle(before, messages[Reserve])
        await instance.handle(_Channel(), messages[Prefill])
        return before.sent

    [refused] = asyncio.run(scenario())
    assert instance.handler.role is Role.PREFILL and instance.guard.epoch == 1
    assert refused.kind == "invalid" and "inst-0 is a prefill instance; it does not take Reserve" in refused.message
    assert handled == [("prefill", messages[Prefill])]


def test_a_message_of_no_role_is_only_logged(monkeypatch, caplog):
    instance, handled = _instance(monkeypatch, Role.BOTH)
    channel = _Channel()
    asyncio.run(instance.handle(channel, Heartbeat()))
    assert channel.sent == [] and handled == []
    assert "unexpected Heartbeat" in caplog.text


async def _nothing() -> None:
    pass
