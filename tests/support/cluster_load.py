"""A steady load through several routers while a test breaks something, and the check that
nothing went wrong with it.

`Load` keeps `concurrency` greedy requests in flight, round-robin over the routers still
answering (a router whose connection is lost is left, as a load balancer's health check
would), until `stop`; each request is bounded by `REQUEST_TIMEOUT_S`. Every request ends in
an `Outcome`. `check` asserts the contract of a cluster under faults: each request completed
with exactly the colocated engine's tokens, or failed with a clear error (an instance lost,
naming it; overloaded; the connection to a killed router lost), having streamed at most a
prefix of those tokens (nothing served twice), and none hung (nothing lost).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import NamedTuple

from minipd.engine.request import INSTANCE_LOST, OVERLOADED
from minipd.engine.sampling_params import SamplingParams
from minipd.router.cluster_client import ClusterClient

REQUEST_TIMEOUT_S = 90.0
LOST = "lost: no final output within the request timeout"


class Outcome(NamedTuple):
    index: int  # of the prompt
    router: str
    started: float  # monotonic
    ended: float
    token_ids: list[int]
    num_finished: int  # finished outputs its stream brought (1 unless something is wrong)
    finish_reason: str | None
    error: str | None
    error_kind: str | None
    prefill_instance: str | None  # of a disaggregated request that completed
    decode_instance: str | None


class Load:
    def __init__(self, clients: dict[str, ClusterClient], prompts: list[list[int]], max_tokens: int, concurrency: int):
        self.clients, self.prompts, self.max_tokens, self.concurrency = dict(clients), prompts, max_tokens, concurrency
        self.outcomes: list[Outcome] = []
        self.in_flight = 0
        self._stop = asyncio.Event()
        self._next = itertools.count()
        self._routers = itertools.cycle(sorted(self.clients))

    def stop(self) -> None:
        """Send no more; `run` returns once the requests in flight ended. Call on the loop."""
        self._stop.set()

    def completed_since(self, start: float, **where) -> int:
        """Completed requests that started after `start` (and match `where`, e.g. router=...)."""
        return sum(
            1
            for o in self.outcomes
            if o.started >= start and o.error is None and all(getattr(o, k) == v for k, v in where.items())
        )

    async def run(self) -> list[Outcome]:
        await asyncio.gather(*(self._worker() for _ in range(self.concurrency)))
        return self.outcomes

    async def _worker(self) -> None:
        while not self._stop.is_set() and self.clients:
            index = next(self._next) % len(self.prompts)
            router = self._pick()
            outcome = await self._one(router, index)
            self.outcomes.append(outcome)
            if outcome.error is not None and outcome.error.startswith("connection lost"):
                self.clients.pop(router, None)

    def _pick(self) -> str:
        while True:
            router = next(self._routers)
            if router in self.clients:
                return router

    async def _one(self, router: str, index: int) -> Outcome:
        started = time.monotonic()
        outputs = []
        self.in_flight += 1
        try:
            params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0, ignore_eos=True)
            stream = self.clients[router].generate(self.prompts[index], params)
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                async for out in stream:
                    outputs.append(out)
        except TimeoutError:
            return Outcome(index, router, started, time.monotonic(), [], 0, None, LOST, None, None, None)
        finally:
            self.in_flight -= 1
        last = outputs[-1]
        transfer = last.transfer
        return Outcome(
            index,
            router,
            started,
            time.monotonic(),
            [t for o in outputs for t in o.token_ids],
            sum(o.finished for o in outputs),
            last.finish_reason,
            last.error,
            last.error_kind,
            transfer.prefill_instance if transfer else None,
            transfer.decode_instance if transfer else None,
        )


def check(outcomes: list[Outcome], expected: list[list[int]], max_tokens: int, lost: set[str] = frozenset()) -> dict:
    """Assert the contract above; `lost` names the instances that may be named by an
    instance-lost error. Returns the counts of completed and of failed requests by kind."""
    counts = {"completed": 0, INSTANCE_LOST: 0, OVERLOADED: 0, "connection lost": 0}
    for o in outcomes:
        what = f"request {o.index} through {o.router}: {o.error or o.finish_reason}"
        assert o.error != LOST, what
        assert o.num_finished == 1, what
        assert o.token_ids == expected[o.index][: len(o.token_ids)], f"{what}: tokens differ from colocated"
        if o.error is None:
            assert o.finish_reason == "length" and len(o.token_ids) == max_tokens, what
            counts["completed"] += 1
        elif o.error_kind == INSTANCE_LOST:
            assert any(name in o.error for name in lost), what
            counts[INSTANCE_LOST] += 1
        elif o.error_kind == OVERLOADED:
            counts[OVERLOADED] += 1
        else:
            assert o.error.startswith("connection lost"), what
            counts["connection lost"] += 1
    return counts
