"""The router's tables and what is done to it outside a request's life: construction, who
observes its requests (the event seam's subscribers: timelines, the latency observer), its
instances (adding them, their stats, in-place role switches), and draining and closing.

`RouterBase` is the half of `router.Router` that no request runs; a request's life (submit,
its tries, the instances' messages, its end) is router.py's, and so are the calls that end
requests (`abort`, `_fail`), which draining and closing use. The tables (requests, their KV
claims and try ids, the instance registry and links) are made here and changed only on the
router's event loop.
"""

from __future__ import annotations

import asyncio
import itertools

from minipd.control.handshake import SharedSecret
from minipd.control.messages import Stats
from minipd.control.role import Role
from minipd.engine.generator import GeneratesFromSubmit
from minipd.engine.kv_admission import KVClaims
from minipd.engine.prompt_encoder import PromptEncoder
from minipd.router.event_seam import RequestEvents
from minipd.router.instance_links import InstanceLinks
from minipd.router.latency_observer import LatencyObserver
from minipd.router.registry import InstanceHandle, InstanceRegistry
from minipd.router.request_subscribers import LatencyRelay, RequestTracer
from minipd.router.role_switch_driver import DEFAULT_DRAIN_TIMEOUT_S, SwitchReport, switch_instance_role
from minipd.router.routed_request import RoutedRequest
from minipd.router.router_config import RouterConfig
from minipd.router.router_counters import RouterCounters
from minipd.router.switch_claims import LOCAL_CLAIMS, SwitchClaims
from minipd.router.timeline_store import TimelineStore
from minipd.router.try_state import TryIds


class RouterBase(GeneratesFromSubmit):
    """The tables of a `Router` (router.py, which inherits this) and its life outside requests."""

    def __init__(
        self,
        tokenizer,
        config: RouterConfig = RouterConfig(),
        model_name: str = "minipd",
        secret: SharedSecret | None = None,
    ):
        config.validate()
        self.tokenizer = tokenizer
        self.prompt_encoder = PromptEncoder(tokenizer)  # for callers that tokenize off the loop
        self.config = config
        self.model_name = model_name
        self.secret = secret  # proven to every instance, and required of them and of clients
        self.registry = InstanceRegistry()
        self._requests: dict[str, RoutedRequest] = {}
        self.kv_claims = KVClaims()  # of the requests in `_requests`
        self.try_ids = TryIds()  # of the requests in `_requests`
        self._ids = itertools.count()
        self.accepting = True  # False once draining: new requests are refused
        self._finished = asyncio.Event()  # set whenever a request ends
        self.counters = RouterCounters()
        self.links = InstanceLinks(self.registry, config, self.counters, secret, self._on_message)
        self.role_changes: list[SwitchReport] = []  # every completed role switch, in order
        self.switch_claims: SwitchClaims = LOCAL_CLAIMS  # who may switch an instance (switch_claims.py)
        self.events = RequestEvents()  # each step of every request, for its subscribers
        self._latency_relay: LatencyRelay | None = None
        self._timelines: TimelineStore | None = None
        self._tracer: RequestTracer | None = None  # subscribed once tracing is on

    @property
    def latency_observer(self) -> LatencyObserver | None:
        """Told of every first token and token gap (None: no one is)."""
        return None if self._latency_relay is None else self._latency_relay.observer

    @latency_observer.setter
    def latency_observer(self, observer: LatencyObserver | None) -> None:
        self._latency_relay = self._resubscribe(
            self._latency_relay, None if observer is None else LatencyRelay(observer)
        )

    @property
    def timelines(self) -> TimelineStore | None:
        """Where every request's timeline is kept (the dashboard's; None: the router keeps none)."""
        return self._timelines

    @timelines.setter
    def timelines(self, store: TimelineStore | None) -> None:
        """Keep every request's events in `store`'s log from now on (it makes them timelines when read)."""
        old = None if self._timelines is None else self._timelines.log
        self._resubscribe(old, None if store is None else store.log)
        self._timelines = store

    def _resubscribe(self, old: object, new: object) -> object:
        """Replace subscriber `old` with `new` on the request events (either may be None); returns `new`."""
        self.events.unsubscribe(old)
        if new is None:
            return None
        self.events.subscribe(new)
        return new

    # ---- instances --------------------------------------------------------------------
    async def add_instance(
        self, host: str, port: int, timeout: float = 30.0, expected_role: Role | None = None
    ) -> InstanceHandle:
        """Connect to an instance, handshake, and register it (instance_links.py says what it raises)."""
        return await self.links.connect(host, port, timeout, expected_role)

    async def ready(self) -> bool:
        return self.accepting and bool(self.registry.decode_candidates())

    def instance_stats(self) -> list[Stats]:
        return self.registry.live_stats()

    def stale_instances(self) -> set[str]:
        """Instances whose stats did not arrive in time lately (not trusted for picking)."""
        return {h.instance_id for h in self.registry.instances.values() if h.is_alive and h.is_stale}

    async def refresh_stats(self, settle: bool = False) -> list[Stats]:
        """Fresh stats of every instance, each within the stats timeout (with `settle`, the call
        timeout, after pending aborts have landed; registry.py)."""
        timeout = self.config.call_timeout_s if settle else self.config.stats_timeout_s
        return await self.registry.refresh_stats(timeout, settle)

    async def switch_role(
        self, instance_id: str, role: Role | str, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    ) -> SwitchReport:
        """Switch an instance's role in place (router/role_switch_driver.py): no new work of its old
        role reaches it, what it runs finishes, its pool is reset, and it serves as `role` with
        a new epoch. Raises UnknownInstance, InvalidRequestError (`role`), SwitchConflict or
        SwitchFailed (the instance then serves on in its old role)."""
        report = await switch_instance_role(self.registry, instance_id, role, drain_timeout_s, self.switch_claims)
        self.role_changes.append(report)
        return report

    def awaiting_first_token(self) -> list[RoutedRequest]:
        """Requests routed and not yet answered with a first token."""
        return [r for r in self._requests.values() if r.last_token_s is None]

    async def drain(self, deadline_s: float) -> bool:
        """Refuse new requests and wait up to `deadline_s` for those under way to finish;
        returns True if none is left (then `close` aborts the rest)."""
        self.accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        while self._requests:
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._finished.clear()
            try:
                await asyncio.wait_for(self._finished.wait(), left)
            except TimeoutError:
                return not self._requests
        return True

    def abort_all(self, reason: str) -> None:
        """End every request under way with `reason` as its error."""
        for routed in list(self._requests.values()):
            self._fail(routed, reason)

    async def close(self) -> None:
        self.accepting = False
        for routed in list(self._requests.values()):
            self.abort(routed.request_id)
        await self.links.close()
        self.prompt_encoder.close()
