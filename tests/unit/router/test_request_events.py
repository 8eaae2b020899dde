"""The router's request event seam (router/request_events.py), on a router whose instances are
scripted here: a request with no subscriber builds no event; a subscriber sees each step once,
in order, with how each try and the request ended, for a disaggregated request, a locally
prefilled one, and a failed try followed by a successful one elsewhere."""

from __future__ import annotations

import asyncio
import time
import types

import pytest
from scripted_instances import PARAMS, PROMPT, add_scripted, prefilled, reserved, token_output

from minipd.control.messages import (
    Decode,
    Generate,
    KVLanded,
    Prefill,
    Reserve,
)
from minipd.control.role import Role
from minipd.engine.request import RequestOutput
from minipd.router import request_events
from minipd.router.outcome import Outcome
from minipd.router.request_events import EVENTS, FirstToken, RequestEnded, TryEnded
from minipd.router.router import Router
from minipd.router.router_config import RouterConfig


class ScriptedChannel:
    """An instance's channel: answers Reserve and Prefill (or fails them with `fail`), and
    streams three tokens for a Decode or a Generate, after saying the KV landed."""

    def __init__(self, name: str, fail: BaseException | None = None) -> None:
        self.name, self.fail, self.close_reason = name, fail, ""
        self.closed = asyncio.Event()
        self.router: Router | None = None

    async def call(self, message, timeout: float):
        if self.fail is not None:
            raise self.fail
        if isinstance(message, Reserve):
            return reserved()
        assert isinstance(message, Prefill)
        return prefilled()

    def send(self, message) -> None:
        if isinstance(message, (Decode, Generate)):
            asyncio.get_running_loop().create_task(self._stream(message.request_id, isinstance(message, Decode)))

    async def _stream(self, wire_id: str, disaggregated: bool) -> None:
        if disaggregated:
            self.router._on_message(self, KVLanded(request_id=wire_id, landed_at=time.time()))
        for n in range(1, 4):
            await asyncio.sleep(0)
            self.router._on_message(self, token_output(wire_id, n))


def instance(router: Router, instance_id: str, role: Role, free: int = 50, fail: BaseException | None = None) -> None:
    channel = ScriptedChannel(instance_id, fail)
    channel.router = router
    add_scripted(router, instance_id, role, channel, free)


class Recorder:
    """A subscriber of every kind: the events' names, a try's and the request's end with how."""

    def __init__(self) -> None:
        self.seen: list[str | tuple] = []
        for kind in EVENTS:
            setattr(self, kind.handler, self._record)

    def _record(self, event) -> None:
        name = type(event).__name__
        if isinstance(event, TryEnded):
            a = event.attempt
            self.seen.append((name, a.number, a.outcome, a.blamed, a.retried))
        elif isinstance(event, RequestEnded):
            self.seen.append((name, event.outcome, event.reason))
        elif self.seen and self.seen[-1] == name == "TokensRelayed":
            pass  # however many outputs follow the first token
        else:
            self.seen.append(name)


def serve(router: Router) -> list[RequestOutput]:
    async def run() -> list[RequestOutput]:
        try:
            return [o async for o in router.generate(PROMPT, PARAMS, "r")]
        finally:
            await router.close()

    return asyncio.run(run())


def new_router(**config) -> Router:
    return Router(None, RouterConfig(local_prefill_max_tokens=0, **config))


DISAGGREGATED = [
    "Routed",
    "ReserveSent",
    "KVReserved",
    "PrefillStarted",
    "PrefillFinished",
    "StreamStarted",
    "KVTransferred",
    "FirstToken",
    "TokensRelayed",
]
FINISHED = [("RequestEnded", Outcome.FINISHED, None)]


def count_built(monkeypatch) -> list[type]:
    """The kinds of the events built from now on, in order."""
    built: list[type] = []
    for kind in EVENTS:
        init = kind.__init__
        monkeypatch.setattr(
            kind, "__init__", lambda self, *a, _init=init: (built.append(type(self)), _init(self, *a))[1]
        )
    return built


def test_no_subscriber_no_event_is_built(monkeypatch):
    built = count_built(monkeypatch)
    router = new_router()
    instance(router, "decode-0", Role.DECODE)
    instance(router, "prefill-0", Role.PREFILL)
    outputs = serve(router)
    assert outputs[-1].finished and outputs[-1].error is None and outputs[-1].transfer is not None
    assert built == []
    request_events.TryStarted(None)  # the counting itself works
    assert built == [request_events.TryStarted]


def test_only_the_kinds_a_subscriber_handles_are_built(monkeypatch):
    built = count_built(monkeypatch)
    router, firsts = new_router(), []
    router.events.subscribe(types.SimpleNamespace(on_first_token=firsts.append))
    instance(router, "decode-0", Role.DECODE)
    assert serve(router)[-1].error is None
    assert built == [FirstToken] and [e.attempt.routed.request_id for e in firsts] == ["r"]


def test_a_disaggregated_request_is_seen_step_by_step():
    router, recorder = new_router(), Recorder()
    router.events.subscribe(recorder)
    instance(router, "decode-0", Role.DECODE)
    instance(router, "prefill-0", Role.PREFILL)
    assert serve(router)[-1].error is None
    assert recorder.seen == [
        "RequestStarted",
        "TryStarted",
        *DISAGGREGATED,
        ("TryEnded", 1, Outcome.FINISHED, None, False),
        *FINISHED,
    ]


def test_a_locally_prefilled_request_is_seen_step_by_step():
    router, recorder = new_router(), Recorder()
    router.events.subscribe(recorder)
    instance(router, "decode-0", Role.DECODE)  # no prefill instance: prefilled on decode
    assert serve(router)[-1].error is None
    assert recorder.seen == [
        "RequestStarted",
        "TryStarted",
        "Routed",
        "StreamStarted",
        "FirstToken",
        "TokensRelayed",
        ("TryEnded", 1, Outcome.FINISHED, None, False),
        *FINISHED,
    ]


def test_a_failed_try_then_a_retry_elsewhere_are_seen_with_their_outcomes():
    router, recorder = new_router(), Recorder()
    router.events.subscribe(recorder)
    instance(router, "decode-0", Role.DECODE, free=90, fail=TimeoutError("no reply to Reserve"))  # picked first
    instance(router, "decode-1", Role.DECODE, free=50)
    instance(router, "prefill-0", Role.PREFILL)
    assert serve(router)[-1].error is None
    assert recorder.seen == [
        "RequestStarted",
        "TryStarted",
        "Routed",
        "ReserveSent",
        ("TryEnded", 1, Outcome.LOST, "decode-0", True),
        "TryStarted",
        *DISAGGREGATED,
        ("TryEnded", 2, Outcome.FINISHED, None, False),
        *FINISHED,
    ]


@pytest.mark.parametrize("subscribed", [True, False])
def test_a_request_that_fails_ends_with_the_outcome_of_its_last_try(subscribed):
    router, recorder = new_router(), Recorder()
    if subscribed:
        router.events.subscribe(recorder)
    instance(router, "decode-0", Role.DECODE, fail=TimeoutError("no reply to Reserve"))
    instance(router, "prefill-0", Role.PREFILL)
    last = serve(router)[-1]
    assert last.error == "no decode instance available" and last.error_kind is None  # decode-0 left out
    if subscribed:
        assert recorder.seen[-4:] == [
            ("TryEnded", 1, Outcome.LOST, "decode-0", True),
            "TryStarted",
            ("TryEnded", 2, Outcome.NO_DECODE, None, False),
            ("RequestEnded", Outcome.NO_DECODE, "no decode instance available"),
        ]
