"""The one route of a KV failure to its try (router.py's dispatch of `KVFailed` into the try's
KV fate, attempt.py): on a router whose two instances are scripted here, each former origin
of a KV failure (the prefill's transfer failing, the decode instance giving the reservation up
while the prefill runs, the Decode finding no KV to load) arrives as the one message and ends
the try the same way: under `kv_load_failure=fail` as KV_FAILED, blaming no instance; under
`recompute` as one recompute on the decode instance, which finishes the request; when an
instance of the transfer died, as a failure blaming it; and a failure both instances report
is acted on, and counted, once."""

from __future__ import annotations

import asyncio

import pytest
from scripted_instances import PARAMS, PROMPT, add_scripted, prefilled, reserved, token_output

from minipd.control.messages import (
    KV_SIDE_DECODE,
    KV_SIDE_PREFILL,
    Abort,
    Decode,
    Generate,
    KVFailed,
    Prefill,
    Reserve,
)
from minipd.control.role import Role
from minipd.engine.request import RequestOutput
from minipd.router.outcome import Outcome
from minipd.router.router import Router
from minipd.router.router_config import RouterConfig

ORIGINS = ("prefill transfer", "reservation given up", "decode load")
REASON = "the KV went nowhere"


class Cluster:
    """A decode and a prefill instance sharing one script: `origin` says which KV failure is
    reported, by whom, and when; `dies`: the instance that dies just before the report;
    `echoed`: the other instance reports the same failure right after; a
    Generate (the recompute, or a retry) streams three tokens. Every message the router sends
    is kept, by instance."""

    def __init__(self, router: Router, origin: str, dies: str | None = None, echoed: bool = False):
        self.router, self.origin, self.dies, self.echoed = router, origin, dies, echoed
        self.sent: dict[str, list] = {"decode-0": [], "prefill-0": []}
        self.handles = {
            instance_id: add_scripted(router, instance_id, role, _Channel(self, instance_id))
            for instance_id, role in (("decode-0", Role.DECODE), ("prefill-0", Role.PREFILL))
        }

    def report(self, instance_id: str, wire_id: str, side: str) -> None:
        """`instance_id` reports the KV failed."""
        if self.dies is not None:
            self.handles[self.dies].mark_lost("killed")
        failed = KVFailed(request_id=wire_id, reason=REASON, side=side)
        self.router._on_message(self.handles[instance_id].channel, failed)
        if self.echoed:
            other = "prefill-0" if instance_id == "decode-0" else "decode-0"
            echo = KVFailed(
                request_id=wire_id, reason=REASON, side=KV_SIDE_PREFILL if side == KV_SIDE_DECODE else KV_SIDE_DECODE
            )
            self.router._on_message(self.handles[other].channel, echo)


class _Channel:
    def __init__(self, cluster: Cluster, name: str):
        self.cluster, self.name, self.close_reason = cluster, name, ""
        self.closed = asyncio.Event()

    async def call(self, message, timeout: float):
        self.cluster.sent[self.name].append(message)
        if isinstance(message, Reserve):
            return reserved()
        assert isinstance(message, Prefill)
        origin = self.cluster.origin
        if origin == "prefill transfer":  # in place of the reply
            self.cluster.report(self.name, message.request_id, KV_SIDE_PREFILL)
        elif origin == "reservation given up":  # while the prefill runs
            self.cluster.report("decode-0", message.request_id, KV_SIDE_DECODE)
        if origin != "decode load":
            await asyncio.Event().wait()  # no reply: the router gives the call up
        return prefilled()

    def send(self, message) -> None:
        self.cluster.sent[self.name].append(message)
        loop = asyncio.get_running_loop()
        if isinstance(message, Decode):  # in place of the stream
            loop.call_soon(self.cluster.report, self.name, message.request_id, KV_SIDE_DECODE)
        elif isinstance(message, Generate):
            for n in range(1, PARAMS.max_tokens + 1):
                loop.call_soon(self.cluster.router._on_message, self, token_output(message.request_id, n))


class Ends:
    """How each try ended, and the recomputes, as the event seam tells them."""

    def __init__(self) -> None:
        self.tries: list[tuple] = []
        self.recomputes: list[str] = []

    def on_try_ended(self, event) -> None:
        a = event.attempt
        self.tries.append((a.number, a.outcome, a.blamed, a.retried))

    def on_recompute(self, event) -> None:
        self.recomputes.append(event.reason)


def serve(
    origin: str, policy: str, dies: str | None = None, echoed: bool = False
) -> tuple[Router, Cluster, Ends, list[RequestOutput]]:
    router, ends = Router(None, RouterConfig(local_prefill_max_tokens=0, kv_load_failure=policy)), Ends()
    router.events.subscribe(ends)
    cluster = Cluster(router, origin, dies, echoed)

    async def run() -> list[RequestOutput]:
        try:
            return [o async for o in router.generate(PROMPT, PARAMS, "r")]
        finally:
            await router.close()

    return router, cluster, ends, asyncio.run(run())


def _first_try_id(cluster: Cluster) -> str:
    return next(m.request_id for m in cluster.sent["decode-0"] if isinstance(m, Reserve))


@pytest.mark.parametrize("origin", ORIGINS)
def test_under_fail_each_origin_ends_the_try_as_kv_failed_blaming_no_instance(origin):
    router, cluster, ends, outputs = serve(origin, "fail")
    [last] = outputs
    assert last.finished and "did not load into decode-0" in last.error and REASON in last.error
    assert ends.tries == [(1, Outcome.KV_FAILED, None, False)] and ends.recomputes == []
    assert router.counters.num_transfer_failures == 1 and router.counters.num_recomputes == 0
    assert Abort(request_id=_first_try_id(cluster)) in cluster.sent["decode-0"]  # its reservation is freed


@pytest.mark.parametrize("origin", ORIGINS)
def test_under_recompute_each_origin_is_prefilled_again_on_its_decode_instance(origin):
    router, cluster, ends, outputs = serve(origin, "recompute")
    assert [o.token_ids for o in outputs] == [[11], [12], [13]]
    assert outputs[-1].error is None and outputs[-1].transfer is None
    assert ends.tries == [(1, Outcome.FINISHED, None, False)] and len(ends.recomputes) == 1
    assert REASON in ends.recomputes[0]
    assert router.counters.num_transfer_failures == 1 and router.counters.num_recomputes == 1
    first = _first_try_id(cluster)
    [generate] = [m for m in cluster.sent["decode-0"] if isinstance(m, Generate)]
    assert generate.request_id != first and generate.token_ids == PROMPT
    assert all(not isinstance(m, Generate) for m in cluster.sent["prefill-0"])


@pytest.mark.parametrize("origin", ORIGINS)
def test_a_kv_failure_of_a_dead_instance_blames_it_and_the_request_goes_on_without_it(origin):
    router, cluster, ends, outputs = serve(origin, "fail", dies="prefill-0")
    assert outputs[-1].error is None and [o.token_ids for o in outputs] == [[11], [12], [13]]
    assert ends.tries == [(1, Outcome.FAILED, "prefill-0", True), (2, Outcome.FINISHED, None, False)]
    assert ends.recomputes == []


@pytest.mark.parametrize("origin", ORIGINS)
def test_a_failure_both_sides_report_is_acted_on_and_counted_once(origin):
    router, _, ends, outputs = serve(origin, "recompute", echoed=True)
    assert outputs[-1].error is None and len(ends.recomputes) == 1
    assert router.counters.num_transfer_failures == 1 and router.counters.num_recomputes == 1
