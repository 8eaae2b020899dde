"""The router: takes requests, picks instances, moves each request through the P/D lifecycle.

For one request (docs/architecture.md, "How a request flows"):
1. tokenize and validate, fixing the sampling seed so prefill and decode sample alike; a
   prompt the HTTP front or the control port validated already (a CheckedPrompt) has its
   invariants checked only (engine/checked_prompt.py);
2. pick a decode instance (free blocks, running requests) and a prefill instance (prefix
   overlap, queue load). The local-prefill policy (prefill_site.py, the planner's) decides
   whether the prompt runs wholly on the decode instance instead (conditional
   disaggregation): when it would compute at most `local_prefill_max_tokens` tokens itself
   (the rest being in its prefix cache), or when the prefill pool is the bottleneck and
   decode has room; every prompt does when there is no prefill instance;
3. `Reserve` on decode (blocks held before prefill starts), then `Prefill` on prefill, which
   streams the KV layer by layer into those blocks and answers with the first token;
4. `Decode` on decode, whose token stream the router relays to the caller.
Steps 2-4 are one try (`attempt.Attempt.run`), which returns the final output; the router
ends the request with it. If a try fails before the first token reached the caller, the
request is tried once more without the instance blamed for the failure; after it, with
`migration_limit`, a try whose decode instance was lost goes on elsewhere from the tokens
relayed (migration.py). A try refused for a stale role epoch (the instance switched roles,
role_switch_driver.py) is not a failure: the request is tried again elsewhere without
counting it. Aborts reach every instance the request touched. The KV never passes through
the router.

The router owns the tables that every path (routing, admission, liveness and eviction, role
switches) reads and changes on one event loop: requests, their KV claims and try ids, and
instances (registry.py, connected and watched by instance_links.py); and it dispatches the
instances' messages to the tries they concern. Each step of a request's life is published on
its event seam, `events` (request_events.py), where the timelines' log (request_log.py), spans
and the latency observer (request_subscribers.py) subscribe.

Longer than 400 lines because: a request's life from submission to its end (tries, retries, migration, aborts) is one
loop over tables that only this class changes; what each try does is attempt.py's."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Sequence

from minipd.control.channel import Channel
from minipd.control.handshake import SharedSecret
from minipd.control.limits import MAX_REQUEST_ID_CHARS
from minipd.control.messages import (
    Abort,
    CallError,
    Draining,
    KVEvents,
    KVFailed,
    KVLanded,
    Message,
    Renew,
    Stats,
    TokenOutput,
)
from minipd.control.role import Role
from minipd.engine.checked_prompt import CheckedPrompt, accept_prompt
from minipd.engine.generator import GeneratesFromSubmit
from minipd.engine.kv_admission import KVClaims, claim_blocks, claim_limit
from minipd.engine.prompt_encoder import PromptEncoder
from minipd.engine.request import RequestOutput
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams
from minipd.engine.unavailable import BackendUnavailableError
from minipd.router import migration
from minipd.router.attempt import Attempt, AttemptFailed
from minipd.router.instance_links import InstanceLinks
from minipd.router.latency_observer import LatencyObserver
from minipd.router.outcome import Outcome
from minipd.router.registry import InstanceHandle, InstanceRegistry
from minipd.router.request_events import KVTransferred, RequestEnded, RequestEvents, RequestStarted
from minipd.router.request_subscribers import LatencyRelay, RequestTracer
from minipd.router.role_switch_driver import DEFAULT_DRAIN_TIMEOUT_S, SwitchReport, switch_instance_role
from minipd.router.routed_request import RoutedRequest
from minipd.router.router_config import RouterConfig
from minipd.router.router_counters import RouterCounters
from minipd.router.switch_claims import LOCAL_CLAIMS, SwitchClaims
from minipd.router.timeline_store import TimelineStore
from minipd.router.try_state import TryIds
from minipd.tracing import exporter

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2  # the first try and one retry on other instances
SHUTDOWN_RETRY_AFTER_S = 5  # a cluster that restarts registers its instances within seconds


class Router(GeneratesFromSubmit):
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

    @property
    def max_model_len(self) -> int:
        lens = [h.welcome.max_model_len for h in self.registry.instances.values()]
        return min(lens) if lens else 0

    @property
    def vocab_size(self) -> int:
        fp = self.registry.fingerprint
        return fp.model.vocab_size if fp else 0

    async def ready(self) -> bool:
        return self.accepting and bool(self.registry.decode_candidates())

    def num_waiting(self) -> int:
        """Requests routed to a decode instance beyond what it runs at once (known without polling)."""
        return sum(
            max(0, h.num_inflight - h.welcome.max_num_seqs)
            for h in self.registry.decode_candidates()
            if h.welcome.max_num_seqs
        )

    def kv_claim_limit(self) -> int | None:
        """The most KV blocks live requests may claim together (None: no limit)."""
        return claim_limit(self.config.kv_admission_ratio, self.registry.decode_num_blocks())

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

    # ---- requests ---------------------------------------------------------------------
    def submit(
        self,
        prompt: str | Sequence[int] | CheckedPrompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        layerwise: bool | None = None,
        traceparent: str | None = None,
    ) -> RequestStream:
        """Validate and start routing; returns the stream of outputs (engine/generator.py: the
        shape every runner of requests shares). Raises InvalidRequestError,
        BackendUnavailableError while shutting down, or NoCapacity when the cluster's KV
        capacity is claimed already (`kv_admission_ratio`).

        A text prompt is tokenized here, on the loop; servers validate off the loop and pass
        a CheckedPrompt (checked_prompt.py), whose invariants only are checked here.
        `layerwise` overrides the router's KV streaming mode for this request (experiments).
        `traceparent`: the caller's W3C trace context, its span's parent (ignored when invalid)."""
        if not self.accepting:
            raise BackendUnavailableError("the router is shutting down", SHUTDOWN_RETRY_AFTER_S)
        if not self.registry.instances:
            raise RuntimeError("the router has no instances")
        checked = accept_prompt(self.tokenizer, prompt, params, self.vocab_size, self.max_model_len)
        token_ids, params = checked.token_ids, checked.params
        request_id = request_id or f"req-{next(self._ids)}"
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidRequestError("request_id", f"longer than {MAX_REQUEST_ID_CHARS} characters")
        if request_id in self._requests:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        claim = claim_blocks(len(token_ids), params.max_tokens, self.max_model_len, self.registry.block_size)
        self.kv_claims.admit(request_id, claim, self.kv_claim_limit())
        stream = RequestStream(request_id, self.abort)
        layerwise = self.config.layerwise if layerwise is None else layerwise
        routed = RoutedRequest(request_id, token_ids, params, stream, layerwise)
        if self._tracer is None and exporter.current is not None:  # tracing is on from now on
            self._tracer = RequestTracer()
            self.events.subscribe(self._tracer)
        self.events.publish(RequestStarted, routed, traceparent)
        self._requests[request_id] = routed
        routed.task = asyncio.get_running_loop().create_task(self._route(routed))
        return stream

    def abort(self, request_id: str) -> bool:
        routed = self._requests.get(request_id)
        if routed is None:
            return False
        self._fail(routed, None)
        return True

    async def _route(self, routed: RoutedRequest) -> None:
        excluded: set[str] = set()
        failed = 0  # failed tries; a stale-epoch or busy refusal is none (each one excludes an instance, so they end)
        for number in itertools.count(1):
            attempt = Attempt(
                self.registry, self.config, self.counters, self.try_ids, self.events, routed, excluded, number
            )
            try:
                output = await attempt.run()
                attempt.end(Outcome.FINISHED, output.error, output=output)
                self.finish(routed, output)
                return
            except AttemptFailed as failure:
                outcome = failure.outcome
                if routed.request_id not in self._requests:  # aborted meanwhile
                    attempt.end(outcome, str(failure), blamed=failure.blamed)
                    return
                if outcome is Outcome.STALE:
                    self.counters.num_stale_retries += 1
                elif outcome.counted:
                    failed += 1
                retry = outcome.may_retry and failed < MAX_ATTEMPTS and not routed.first_token_sent
                migrate = not retry and migration.due(routed, failure, self.config.migration_limit)
                attempt.end(outcome, str(failure), blamed=failure.blamed, retried=retry)
                log.log(
                    logging.WARNING if outcome.counted else logging.INFO,
                    "%s: attempt %d %s%s: %s%s",
                    routed.request_id,
                    failed,
                    "refused (stale role epoch)" if outcome is Outcome.STALE else "failed",
                    f" on {failure.blamed}" if failure.blamed else "",
                    failure,
                    "; retrying" if retry else "; going on elsewhere (migration)" if migrate else "",
                )
                self._abort_on_instances(routed)
                if migrate:
                    migration.move(routed, self.tokenizer, self.counters)
                elif not retry:
                    self._fail(routed, str(failure), outcome)
                    return
                if failure.blamed is not None:
                    excluded.add(failure.blamed)
            except asyncio.CancelledError as exc:
                attempt.end(Outcome.ABORTED, str(exc) or type(exc).__name__)
                return
            except Exception as exc:  # never leave a caller waiting on a stream that will not end
                log.exception("%s: routing failed", routed.request_id)
                self._fail(routed, f"internal error: {type(exc).__name__}", Outcome.INTERNAL)
                attempt.end(Outcome.INTERNAL, str(exc) or type(exc).__name__)
                return

    def _on_message(self, channel: Channel, message: Message) -> None:
        attempt = self.try_ids.get(message.request_id)
        match message:
            case TokenOutput() | CallError():  # a CallError: an instance refused a stream (a stale role epoch)
                if attempt is not None and attempt.outputs is not None:
                    attempt.outputs.put_nowait(message)
            case KVLanded():
                if attempt is not None:
                    self.events.publish(KVTransferred, attempt, message)
                    attempt.routed.record_landing(message)
            case KVFailed():  # the one route of a KV failure to its try, from either side
                if attempt is not None and attempt.kv_failed(message):  # counted once, as the try acts on it
                    where = f"{message.request_id} on {channel.name} ({message.side} side)"
                    self.counters.transfer_failed(f"{where}: {message.reason}")
            case Renew():
                # the prefill instance of the current try progressed: pass the renewal on
                handle = self.links.by_channel.get(channel)
                if attempt is not None and handle is not None and attempt.prefilling is handle:
                    attempt.decode.channel.send(Renew(request_id=message.request_id))
            case Draining():
                handle = self.links.by_channel.get(channel)
                if handle is not None:
                    log.info("instance %s is shutting down: routing nothing new there", handle.instance_id)
                    handle.draining = True
            case KVEvents():  # the prefix index: what the instance's cache (and the tier) now hold
                self.registry.kv_events(self.links.by_channel.get(channel), message.events)
            case _:
                log.warning("%s: unexpected %s", channel.name, type(message).__name__)

    def finish(self, routed: RoutedRequest, last: RequestOutput) -> None:
        """End the request once with its final output from an instance."""
        if self._forget(routed):
            self.events.publish(RequestEnded, routed, Outcome.FINISHED, last.error, last)
            routed.stream.put(last)
            self._finished.set()

    def _fail(self, routed: RoutedRequest, error: str | None, outcome: Outcome | None = None) -> None:
        """End the request once as aborted (`error` None) or failed (`outcome`: how; FAILED when
        not said): every instance it touched is told, and its routing task stops."""
        if not self._forget(routed):
            return
        if outcome is None:
            outcome = Outcome.ABORTED if error is None else Outcome.FAILED
        self._finished.set()
        self._abort_on_instances(routed)
        if routed.task is not None and routed.task is not asyncio.current_task():
            routed.task.cancel()
        last = RequestOutput.aborted(routed.request_id, error, len(routed.token_ids), outcome.error_kind)
        self.events.publish(RequestEnded, routed, outcome, error, last)
        routed.stream.put(last)

    def _forget(self, routed: RoutedRequest) -> bool:
        """Drop a live request and its KV claim; False if it had ended already."""
        if self._requests.pop(routed.request_id, None) is None:
            return False
        self.try_ids.forget(routed)
        self.kv_claims.release(routed.request_id)
        return True

    def _abort_on_instances(self, routed: RoutedRequest) -> None:
        for instance_id in routed.instances:
            handle = self.registry.instances.get(instance_id)
            if handle is not None:
                handle.channel.send(Abort(request_id=routed.wire_id))
