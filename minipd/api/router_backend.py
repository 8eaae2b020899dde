"""`ServingBackend` over the router of a disaggregated cluster.

The router already speaks the backend's language (`submit` returns a stream that aborts
on every instance the request touched when left early; `ready` means a decode-capable
instance is alive); this adapter names its instances' stats the way the HTTP front and
its gauges expect them, and turns "no instance to route to" into a 503. KV transfer
figures reach /metrics through `RequestOutput.transfer` on each final output; failed
transfers, which no final output reports (a retry may still succeed), through
`RouterCounters.on_transfer_failure`.
"""

from __future__ import annotations

from typing import Callable

from minipd.api.backend import InstanceStats, OutputStream
from minipd.engine.block_manager import BlockUsage
from minipd.engine.checked_prompt import CheckedPrompt
from minipd.engine.engine import EngineStats
from minipd.engine.unavailable import BackendUnavailableError
from minipd.router.router import Router

NO_INSTANCE_RETRY_AFTER_S = 5  # instances (re)register within seconds when a cluster (re)starts


class RouterBackend:
    def __init__(self, router: Router, model_name: str | None = None):
        self.router = router
        self.model_name = model_name or router.model_name
        self.tokenizer = router.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.router.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.router.vocab_size

    def submit(self, prompt: CheckedPrompt, request_id: str, *, traceparent: str | None = None) -> OutputStream:
        """`Router.submit` refuses a request while the router shuts down (BackendUnavailableError)."""
        if self.router.accepting and not self.router.registry.decode_candidates():
            raise BackendUnavailableError("no decode instance is reachable", NO_INSTANCE_RETRY_AFTER_S)
        return self.router.submit(prompt, None, request_id, traceparent=traceparent)

    async def ready(self) -> bool:
        return await self.router.ready()

    def num_waiting(self) -> int:
        return self.router.num_waiting()

    def instance_stats(self) -> list[InstanceStats]:
        roles = {h.instance_id: h.role for h in self.router.registry.instances.values()}  # current after a switch
        stale = self.router.stale_instances()
        return [
            InstanceStats(
                s.instance_id,
                roles.get(s.instance_id, s.role),
                EngineStats(
                    s.num_running,
                    s.num_waiting,
                    0,
                    BlockUsage(s.num_blocks, s.num_free_blocks, s.num_used_blocks, s.num_cached_blocks),
                    num_prefilling=s.num_prefilling,
                ),
                stale=s.instance_id in stale,
                kv_tier=s.kv_tier,
            )
            for s in self.router.instance_stats()
        ]

    def on_transfer_failure(self, callback: Callable[[str], None]) -> None:
        self.router.counters.on_transfer_failure = callback
