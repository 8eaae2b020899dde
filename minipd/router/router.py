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
instances' messages to the tries they concern. The tables, and what is done to the router
outside a request (its instances, role switches, draining, closing), are router_base.py's;
what each try does is attempt.py's. Each step of a request's life is published on its event
seam, `events` (request_events.py), where the timelines' log (request_log.py), spans and the
latency observer (request_subscribers.py) subscribe."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Sequence

from minipd.control.channel import Channel
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
    TokenOutput,
)
from minipd.engine.checked_prompt import CheckedPrompt, accept_prompt
from minipd.engine.kv_admission import claim_blocks, claim_limit
from minipd.engine.request import RequestOutput
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams
from minipd.engine.unavailable import BackendUnavailableError
from minipd.router import migration
from minipd.router.attempt import Attempt, AttemptFailed
from minipd.router.outcome import Outcome
from minipd.router.request_events import KVTransferred, RequestEnded, RequestStarted
from minipd.router.request_subscribers import RequestTracer
from minipd.router.routed_request import RoutedRequest
from minipd.router.router_base import RouterBase
from minipd.tracing import exporter

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2  # the first try and one retry on other instances
SHUTDOWN_RETRY_AFTER_S = 5  # a cluster that restarts registers its instances within seconds


class Router(RouterBase):
    """A request's life at the router (module docstring); its tables and life outside requests
    are `RouterBase`'s (router_base.py)."""

    # ---- what requests read of the instances ------------------------------------------
    @property
    def max_model_len(self) -> int:
        lens = [h.welcome.max_model_len for h in self.registry.instances.values()]
        return min(lens) if lens else 0

    @property
    def vocab_size(self) -> int:
        fp = self.registry.fingerprint
        return fp.model.vocab_size if fp else 0

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
