"""The router: takes requests, picks instances, moves each request through the P/D lifecycle.

For one request (docs/architecture.md, "How a request flows"):
1. tokenize and validate; fix the sampling seed so prefill and decode sample alike;
2. pick a decode instance (free blocks, running requests) and a prefill instance (prefix
   overlap, queue load). A prompt of which the decode instance would have to compute at
   most `local_prefill_max_tokens` tokens itself (the rest being in its prefix cache) runs
   wholly there (conditional disaggregation), as does every prompt when there is no
   prefill instance;
3. `Reserve` on decode (blocks held before prefill starts), then `Prefill` on prefill, which
   streams the KV layer by layer into those blocks and answers with the first token;
4. `Decode` on decode, whose token stream the router relays to the caller.
Steps 2-4 are one try (`attempt.run_attempt`). If a try fails before the first token reached
the caller, the request is tried once more without the instance blamed for the failure.
Aborts reach every instance the request touched. The KV never passes through the router.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Callable, Sequence

import msgspec

from minipd.control.channel import DEFAULT_LIVENESS_TIMEOUT_S, Channel, ChannelClosed, RemoteError
from minipd.control.messages import (PROTOCOL_VERSION, Abort, Draining, Evict, GetStats, Hello, KVLanded, Message,
                                     PeerLost, Renew, Stats, TokenOutput, Welcome)
from minipd.control.role import Role
from minipd.engine.prompt_check import prompt_token_ids
from minipd.engine.request import FinishReason, RequestOutput
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams
from minipd.router.attempt import AttemptFailed, run_attempt
from minipd.router.registry import IncompatibleInstance, InstanceHandle, InstanceRegistry
from minipd.router.routed_request import RoutedRequest

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
STALE_AFTER_POLLS = 3  # stats missing for this many polls (plus one poll's timeout) are stale
MAX_ATTEMPTS = 2  # the first try and one retry on other instances
KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")


class RouterConfig(msgspec.Struct, frozen=True, kw_only=True):
    local_prefill_max_tokens: int = 16  # uncached prompt tokens at or below which decode prefills itself
    layerwise: bool = True  # stream KV per layer during prefill, or send it all afterwards
    call_timeout_s: float = 120.0
    liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S  # an instance silent this long is declared dead; 0: off
    inter_token_timeout_s: float = 60.0  # a relayed stream with no output for this long fails
    kv_load_failure: str = "recompute"  # the KV did not arrive: "recompute" on the decode instance, or "fail"
    stats_timeout_s: float = 1.0  # one stats poll of one instance

    def validate(self) -> None:
        for field in ("call_timeout_s", "inter_token_timeout_s", "stats_timeout_s"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field}: must be positive, got {getattr(self, field)}")
        if self.liveness_timeout_s < 0:
            raise ValueError(f"liveness_timeout_s: must be >= 0 (0 disables it), got {self.liveness_timeout_s}")
        if self.kv_load_failure not in KV_LOAD_FAILURE_POLICIES:
            raise ValueError(f"kv_load_failure: expected one of {list(KV_LOAD_FAILURE_POLICIES)}, "
                             f"got {self.kv_load_failure!r}")


class Router:
    def __init__(self, tokenizer, config: RouterConfig = RouterConfig(), model_name: str = "minipd"):
        config.validate()
        self.tokenizer = tokenizer
        self.config = config
        self.model_name = model_name
        self.registry = InstanceRegistry()
        self._requests: dict[str, RoutedRequest] = {}
        self._by_wire: dict[str, RoutedRequest] = {}  # the current try's id -> its request
        self._tries = itertools.count()
        self._by_channel: dict[Channel, InstanceHandle] = {}
        self._ids = itertools.count()
        self._stats_task: asyncio.Task | None = None
        self._closing = False
        self.accepting = True  # False once draining: new requests are refused
        self._finished = asyncio.Event()  # set whenever a request ends
        self.num_busy_waits = 0  # reservations retried because a decode pool was full
        self.num_transfer_failures = 0
        self.num_evictions = 0  # instances declared dead for silence
        self.num_recomputes = 0  # requests whose KV did not load, prefilled again on their decode instance
        self.on_transfer_failure: Callable[[str], None] | None = None  # told of each failed KV transfer

    # ---- instances --------------------------------------------------------------------
    async def add_instance(self, host: str, port: int, timeout: float = 30.0,
                           expected_role: Role | None = None) -> InstanceHandle:
        """Connect to an instance's control port, handshake, and register it.

        Raises IncompatibleInstance (fingerprint mismatch, saying what differs, or another role
        than `expected_role`), or ConnectionError/TimeoutError when it cannot be reached.
        """
        channel = await Channel.connect(host, port, self._on_message, f"router->{host}:{port}", timeout)
        try:
            welcome = await channel.call(Hello(protocol_version=PROTOCOL_VERSION, role=Role.ROUTER,
                                               liveness_timeout_s=self.config.liveness_timeout_s), timeout)
            if not isinstance(welcome, Welcome):
                raise IncompatibleInstance(f"{host}:{port} answered the handshake with {type(welcome).__name__}")
            if expected_role is not None and welcome.role is not expected_role:
                raise IncompatibleInstance(f"{host}:{port} is a {welcome.role.value} instance, not "
                                           f"{expected_role.value}")
            handle = InstanceHandle(welcome, channel, (host, port))
            handle.stale_after_s = STALE_AFTER_POLLS * STATS_INTERVAL_S + self.config.stats_timeout_s
            self.registry.add(handle)
        except BaseException:
            await channel.close()
            raise
        self._by_channel[channel] = handle
        handle.set_stats(await channel.call(GetStats(), timeout))
        if welcome.liveness_timeout_s > 0 and self.config.liveness_timeout_s > 0:
            channel.watch_liveness(self.config.liveness_timeout_s, welcome.liveness_timeout_s,
                                   on_silent=lambda reason: self._evict(handle, reason))
        asyncio.get_running_loop().create_task(self._watch(handle))
        if self._stats_task is None:
            self._stats_task = asyncio.get_running_loop().create_task(self._poll_stats())
        log.info("registered %s (%s) at %s:%d", handle.instance_id, handle.role.value, host, port)
        return handle

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
        return sum(max(0, h.num_inflight - h.welcome.max_num_seqs)
                   for h in self.registry.decode_candidates() if h.welcome.max_num_seqs)

    def instance_stats(self) -> list[Stats]:
        return [h.stats for h in self.registry.instances.values() if h.stats is not None and h.is_alive]

    def stale_instances(self) -> set[str]:
        """Instances whose stats did not arrive in time lately (not trusted for picking)."""
        return {h.instance_id for h in self.registry.instances.values() if h.is_alive and h.is_stale}

    async def refresh_stats(self, settle: bool = False) -> list[Stats]:
        """Ask every instance for fresh stats, all at once, each within the stats timeout (with
        `settle`, the call timeout, after pending aborts have landed); one that does not answer
        in time keeps its old stats, which turn stale."""
        timeout = self.config.call_timeout_s if settle else self.config.stats_timeout_s
        await asyncio.gather(*(self._poll(h, settle, timeout) for h in list(self.registry.instances.values())))
        return self.instance_stats()

    @staticmethod
    async def _poll(handle: InstanceHandle, settle: bool, timeout: float) -> None:
        try:
            handle.set_stats(await handle.channel.call(GetStats(settle=settle), timeout))
        except (ChannelClosed, TimeoutError, RemoteError):
            pass

    def note_transfer_failure(self, what: str) -> None:
        """A KV transfer failed (seen by the sender or by the receiver)."""
        self.num_transfer_failures += 1
        log.warning("KV transfer failed: %s", what)
        if self.on_transfer_failure is not None:
            self.on_transfer_failure(what)

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
        self._closing = True
        self.accepting = False
        if self._stats_task is not None:
            self._stats_task.cancel()
        for routed in list(self._requests.values()):
            self.abort(routed.request_id)
        for handle in list(self._by_channel.values()):
            await handle.channel.close()

    # ---- requests ---------------------------------------------------------------------
    def submit(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
               request_id: str | None = None, layerwise: bool | None = None) -> RequestStream:
        """Validate and start routing; returns the stream of outputs (raises InvalidRequestError).

        `layerwise` overrides the router's KV streaming mode for this request (experiments)."""
        params = (params or SamplingParams()).with_seed()
        if not self.accepting:
            raise RuntimeError("the router is shutting down")
        if not self.registry.instances:
            raise RuntimeError("the router has no instances")
        params.validate(self.vocab_size)
        token_ids = prompt_token_ids(self.tokenizer, prompt, self.vocab_size, self.max_model_len)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._requests:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        stream = RequestStream(request_id, self.abort)
        routed = RoutedRequest(request_id, token_ids, params, stream,
                               self.config.layerwise if layerwise is None else layerwise)
        self._requests[request_id] = routed
        routed.task = asyncio.get_running_loop().create_task(self._route(routed))
        return stream

    async def generate(self, prompt, params: SamplingParams | None = None, request_id: str | None = None,
                       layerwise: bool | None = None):
        async with self.submit(prompt, params, request_id, layerwise) as stream:
            async for output in stream:
                yield output

    def abort(self, request_id: str) -> bool:
        routed = self._requests.get(request_id)
        if routed is None:
            return False
        self._fail(routed, None)
        return True

    async def _route(self, routed: RoutedRequest) -> None:
        excluded: set[str] = set()
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                await run_attempt(self, routed, excluded)
                return
            except AttemptFailed as failure:
                if routed.request_id not in self._requests:
                    return  # aborted meanwhile
                retry = failure.retry and attempt < MAX_ATTEMPTS and not routed.first_token_sent
                log.warning("%s: attempt %d failed%s: %s%s", routed.request_id, attempt,
                            f" on {failure.blamed}" if failure.blamed else "", failure, "; retrying" if retry else "")
                self._abort_on_instances(routed)
                if not retry:
                    self._fail(routed, str(failure))
                    return
                if failure.blamed is not None:
                    excluded.add(failure.blamed)
            except asyncio.CancelledError:
                return
            except Exception as exc:  # never leave a caller waiting on a stream that will not end
                log.exception("%s: routing failed", routed.request_id)
                self._fail(routed, f"internal error: {type(exc).__name__}")
                return

    def begin_try(self, routed: RoutedRequest) -> None:
        """Give `routed` a fresh id for its next try: an instance that saw an earlier try (and
        remembers it as aborted) never mistakes the new one for it."""
        self._by_wire.pop(routed.wire_id, None)
        routed.wire_id = f"{routed.request_id}@{next(self._tries)}"
        self._by_wire[routed.wire_id] = routed

    def _on_message(self, channel: Channel, message: Message) -> None:
        routed = self._by_wire.get(message.request_id)
        match message:
            case TokenOutput():
                if routed is not None and routed.outputs is not None:
                    routed.outputs.put_nowait(message)
            case KVLanded(error=None):
                if routed is not None:
                    routed.record_landing(message.landed_at)
            case KVLanded():
                self.note_transfer_failure(f"{message.request_id} on {channel.name}: {message.error}")
                if routed is not None:
                    routed.kv_failed(message.error)
            case Renew():
                # the prefill instance of the current try progressed: pass the renewal on
                handle = self._by_channel.get(channel)
                if routed is not None and routed.prefill is handle and routed.decode is not None:
                    routed.decode.channel.send(Renew(request_id=message.request_id))
            case Draining():
                handle = self._by_channel.get(channel)
                if handle is not None:
                    log.info("instance %s is shutting down: routing nothing new there", handle.instance_id)
                    handle.draining = True
            case _:
                log.warning("%s: unexpected %s", channel.name, type(message).__name__)

    def finish(self, routed: RoutedRequest, last: RequestOutput) -> None:
        """End the request once with its final output from an instance."""
        if self._requests.pop(routed.request_id, None) is not None:
            self._by_wire.pop(routed.wire_id, None)
            routed.stream.put(last)
            self._finished.set()

    def _fail(self, routed: RoutedRequest, error: str | None) -> None:
        """End the request once as aborted (`error` None) or failed: every instance it touched
        is told, and its routing task stops."""
        if self._requests.pop(routed.request_id, None) is None:
            return
        self._finished.set()
        self._abort_on_instances(routed)
        self._by_wire.pop(routed.wire_id, None)
        if routed.task is not None and routed.task is not asyncio.current_task():
            routed.task.cancel()
        routed.stream.put(RequestOutput.aborted(routed.request_id, error, len(routed.token_ids)))

    def _abort_on_instances(self, routed: RoutedRequest) -> None:
        for instance_id in routed.instances:
            handle = self.registry.instances.get(instance_id)
            if handle is not None:
                handle.channel.send(Abort(request_id=routed.wire_id))

    # ---- liveness ---------------------------------------------------------------------
    def _evict(self, handle: InstanceHandle, reason: str) -> None:
        """`handle` went silent: declare it dead now (its requests end, it is never picked
        again, its peers drop what they do with it), but keep the connection open to learn when
        it can no longer write (it closes once it ended everything, or its process is gone)."""
        if handle.evicted or not handle.is_alive or self._closing:
            return
        handle.evicted = True
        self.num_evictions += 1
        log.warning("instance %s declared dead: %s", handle.instance_id, reason)
        handle.channel.send(Evict(reason=reason))
        self._lose(handle, f"{handle.instance_id} declared dead: {reason}", fenced=False)
        handle.channel.fail_calls(f"{handle.instance_id} declared dead: {reason}")

    def _lose(self, handle: InstanceHandle, reason: str, fenced: bool) -> None:
        if self.registry.instances.get(handle.instance_id) is handle:
            self.registry.remove(handle.instance_id)
        handle.mark_lost(reason)
        for other in self.registry.instances.values():
            other.channel.send(PeerLost(instance_id=handle.instance_id, reason=reason, fenced=fenced))

    async def _watch(self, handle: InstanceHandle) -> None:
        await handle.channel.closed.wait()
        self._by_channel.pop(handle.channel, None)
        if self._closing:
            return
        reason = f"{handle.instance_id}: connection closed ({handle.channel.close_reason})"
        if not handle.evicted:
            log.warning("instance %s lost: %s", handle.instance_id, handle.channel.close_reason)
            self._lose(handle, reason, fenced=True)
            return
        successor = self.registry.instances.get(handle.instance_id)
        if successor is not None:
            # Registered again meanwhile (resumed, or restarted under the same id): its peers must
            # not drop what they do with the registered one; blocks they hold for the old one's
            # writes go back when those writes' ends arrive.
            log.info("the old connection of %s closed; it is registered again", handle.instance_id)
            return
        for other in self.registry.instances.values():  # it can write no more: fence its writes
            other.channel.send(PeerLost(instance_id=handle.instance_id, reason=reason, fenced=True))

    async def _poll_stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)  # periodic load report, not a synchronisation
            await self.refresh_stats()
