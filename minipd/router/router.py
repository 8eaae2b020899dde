"""The router: takes requests, picks instances, moves each request through the P/D lifecycle.

For one request (docs/architecture.md, "How a request flows"):
1. tokenize and validate; fix the sampling seed so prefill and decode sample alike;
2. pick a decode instance (free blocks, running requests) and a prefill instance (prefix
   overlap, queue load). The local-prefill policy (placement.py, the planner's) decides
   whether the prompt runs wholly on the decode instance instead (conditional
   disaggregation): when it would compute at most `local_prefill_max_tokens` tokens itself
   (the rest being in its prefix cache), or when the prefill pool is the bottleneck and
   decode has room; every prompt does when there is no prefill instance;
3. `Reserve` on decode (blocks held before prefill starts), then `Prefill` on prefill, which
   streams the KV layer by layer into those blocks and answers with the first token;
4. `Decode` on decode, whose token stream the router relays to the caller.
Steps 2-4 are one try (`attempt.run_attempt`). If a try fails before the first token reached
the caller, the request is tried once more without the instance blamed for the failure. A
try refused for a stale role epoch (the instance switched roles, role_switch.py) is not a
failure: the request is tried again elsewhere without counting it.
Aborts reach every instance the request touched. The KV never passes through the router.


Length: one class owns the request table and the instance table that every path (routing,
admission, liveness and eviction, role switches) reads and changes on the same event loop;
the try itself is in attempt.py, picking in registry.py, switches in role_switch.py."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from typing import Callable, Sequence

import msgspec

from minipd.control.channel import DEFAULT_LIVENESS_TIMEOUT_S, Channel, ChannelClosed, RemoteError
from minipd.control.handshake import SharedSecret, open_channel
from minipd.control.limits import MAX_REQUEST_ID_CHARS
from minipd.control.messages import (
    Abort,
    CallError,
    Draining,
    Evict,
    GetStats,
    KVLanded,
    Message,
    PeerLost,
    Renew,
    Stats,
    TokenOutput,
)
from minipd.control.role import Role
from minipd.engine.kv_admission import DEFAULT_KV_ADMISSION_RATIO, KVClaims, claim_blocks, claim_limit, validate_ratio
from minipd.engine.prompt_check import prompt_token_ids
from minipd.engine.prompt_encoder import PromptEncoder
from minipd.engine.request import OVERLOADED, RequestOutput
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams
from minipd.policy.local_prefill import LocalPrefillThresholds, Placement
from minipd.router.attempt import AttemptFailed, run_attempt
from minipd.router.latency_observer import LatencyObserver
from minipd.router.registry import IncompatibleInstance, InstanceHandle, InstanceRegistry
from minipd.router.role_switch import DEFAULT_DRAIN_TIMEOUT_S, SwitchReport, switch_instance_role
from minipd.router.routed_request import RoutedRequest

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
STALE_AFTER_POLLS = 3  # stats missing for this many polls (plus one poll's timeout) are stale
MAX_ATTEMPTS = 2  # the first try and one retry on other instances
KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")


class RouterConfig(msgspec.Struct, frozen=True, kw_only=True):
    local_prefill_max_tokens: int = 16  # uncached prompt tokens at or below which decode prefills itself
    # the prefill pool is the bottleneck when its least-loaded instance has more than this
    # many prompt tokens (or prompts) queued; a prompt then runs on decode if decode has room
    prefill_busy_tokens: int | None = None  # None: rule off
    prefill_busy_requests: int | None = None
    decode_room_kv_fraction: float = 0.9  # decode has room: KV use after admission at most this
    decode_room_max_running: int | None = None  # and fewer sequences than this (None: its max_num_seqs)
    layerwise: bool = True  # stream KV per layer during prefill, or send it all afterwards
    call_timeout_s: float = 120.0
    # accept a request while the KV claims of live requests fit in this many times the decode
    # instances' blocks (engine/kv_admission.py); None or 0: no limit
    kv_admission_ratio: float | None = DEFAULT_KV_ADMISSION_RATIO
    kv_wait_s: float = 30.0  # longest a request waits for room in a decode pool before it fails as overloaded
    liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S  # an instance silent this long is declared dead; 0: off
    inter_token_timeout_s: float = 60.0  # a relayed stream with no output for this long fails
    kv_load_failure: str = "recompute"  # the KV did not arrive: "recompute" on the decode instance, or "fail"
    stats_timeout_s: float = 1.0  # one stats poll of one instance

    def validate(self) -> None:
        validate_ratio(self.kv_admission_ratio)
        for field in ("call_timeout_s", "inter_token_timeout_s", "stats_timeout_s", "kv_wait_s"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field}: must be positive, got {getattr(self, field)!r}")
        if self.liveness_timeout_s < 0:
            raise ValueError(f"liveness_timeout_s: must be >= 0 (0 disables it), got {self.liveness_timeout_s}")
        if self.kv_load_failure not in KV_LOAD_FAILURE_POLICIES:
            raise ValueError(
                f"kv_load_failure: expected one of {list(KV_LOAD_FAILURE_POLICIES)}, got {self.kv_load_failure!r}"
            )

    def __post_init__(self) -> None:
        for field in ("prefill_busy_tokens", "prefill_busy_requests", "decode_room_max_running"):
            value = getattr(self, field)
            if value is not None and value < 0:
                raise ValueError(f"{field}: must be >= 0, got {value}")
        if not 0 < self.decode_room_kv_fraction <= 1:
            raise ValueError(f"decode_room_kv_fraction: must be in (0, 1], got {self.decode_room_kv_fraction}")

    @property
    def local_prefill(self) -> LocalPrefillThresholds:
        """The placement policy's thresholds (a negative local_prefill_max_tokens turns rule 1 off)."""
        return LocalPrefillThresholds(
            max_local_tokens=max(0, self.local_prefill_max_tokens),
            prefill_busy_tokens=self.prefill_busy_tokens,
            prefill_busy_requests=self.prefill_busy_requests,
            decode_max_kv_fraction=self.decode_room_kv_fraction,
            decode_max_running=self.decode_room_max_running,
        )


class Router:
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
        self.num_stale_retries = 0  # tries refused for a stale role epoch, and retried
        self.placements: Counter[Placement] = Counter()  # local-prefill policy decisions
        self.role_changes: list[SwitchReport] = []  # every completed role switch, in order
        self.latency_observer: LatencyObserver | None = None  # told of every first token and token gap
        self.num_evictions = 0  # instances declared dead for silence
        self.num_recomputes = 0  # requests whose KV did not load, prefilled again on their decode instance
        self.on_transfer_failure: Callable[[str], None] | None = None  # told of each failed KV transfer

    # ---- instances --------------------------------------------------------------------
    async def add_instance(
        self, host: str, port: int, timeout: float = 30.0, expected_role: Role | None = None
    ) -> InstanceHandle:
        """Connect to an instance's control port, handshake, and register it.

        Raises IncompatibleInstance (fingerprint mismatch, saying what differs, or another role
        than `expected_role`), AuthenticationError (the instance and the router do not share
        the cluster secret), or ConnectionError/TimeoutError when it cannot be reached.
        """
        channel, welcome = await open_channel(
            host,
            port,
            self._on_message,
            f"router->{host}:{port}",
            Role.ROUTER,
            self.secret,
            timeout,
            self.config.liveness_timeout_s,
        )
        try:
            if expected_role is not None and welcome.role is not expected_role:
                raise IncompatibleInstance(
                    f"{host}:{port} is a {welcome.role.value} instance, not {expected_role.value}"
                )
            handle = InstanceHandle(welcome, channel, (host, port))
            handle.stale_after_s = STALE_AFTER_POLLS * STATS_INTERVAL_S + self.config.stats_timeout_s
            self.registry.add(handle)
        except BaseException:
            await channel.close()
            raise
        self._by_channel[channel] = handle
        handle.set_stats(await channel.call(GetStats(), timeout))
        if welcome.liveness_timeout_s > 0 and self.config.liveness_timeout_s > 0:
            channel.watch_liveness(
                self.config.liveness_timeout_s,
                welcome.liveness_timeout_s,
                on_silent=lambda reason: self._evict(handle, reason),
            )
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
        return sum(
            max(0, h.num_inflight - h.welcome.max_num_seqs)
            for h in self.registry.decode_candidates()
            if h.welcome.max_num_seqs
        )

    def kv_claim_limit(self) -> int | None:
        """The most KV blocks live requests may claim together (None: no limit)."""
        return claim_limit(self.config.kv_admission_ratio, self.registry.decode_num_blocks())

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

    async def switch_role(
        self, instance_id: str, role: Role | str, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    ) -> SwitchReport:
        """Switch an instance's role in place (router/role_switch.py): no new work of its old
        role reaches it, what it runs finishes, its pool is reset, and it serves as `role` with
        a new epoch. Raises UnknownInstance, InvalidRequestError (`role`), SwitchConflict or
        SwitchFailed (the instance then serves on in its old role)."""
        report = await switch_instance_role(self, instance_id, role, drain_timeout_s)
        self.role_changes.append(report)
        return report

    def awaiting_first_token(self) -> list[RoutedRequest]:
        """Requests routed and not yet answered with a first token."""
        return [r for r in self._requests.values() if r.last_token_s is None]

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
        self.prompt_encoder.close()

    # ---- requests ---------------------------------------------------------------------
    def submit(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        layerwise: bool | None = None,
    ) -> RequestStream:
        """Validate and start routing; returns the stream of outputs. Raises InvalidRequestError,
        or NoCapacity when the cluster's KV capacity is claimed already (`kv_admission_ratio`).

        A text prompt is tokenized here, on the loop; servers pass token ids from
        `prompt_encoder` instead. `layerwise` overrides the router's KV streaming mode for this
        request (experiments)."""
        params = (params or SamplingParams()).with_seed()
        if not self.accepting:
            raise RuntimeError("the router is shutting down")
        if not self.registry.instances:
            raise RuntimeError("the router has no instances")
        params.validate(self.vocab_size)
        token_ids = prompt_token_ids(self.tokenizer, prompt, self.vocab_size, self.max_model_len)
        request_id = request_id or f"req-{next(self._ids)}"
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidRequestError("request_id", f"longer than {MAX_REQUEST_ID_CHARS} characters")
        if request_id in self._requests:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        claim = claim_blocks(len(token_ids), params.max_tokens, self.max_model_len, self.registry.block_size)
        self.kv_claims.admit(request_id, claim, self.kv_claim_limit())
        stream = RequestStream(request_id, self.abort)
        routed = RoutedRequest(
            request_id, token_ids, params, stream, self.config.layerwise if layerwise is None else layerwise
        )
        self._requests[request_id] = routed
        routed.task = asyncio.get_running_loop().create_task(self._route(routed))
        return stream

    async def generate(
        self, prompt, params: SamplingParams | None = None, request_id: str | None = None, layerwise: bool | None = None
    ):
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
        attempt = 0  # failed tries; a stale-epoch refusal is none (each one excludes an instance, so they end)
        while True:
            try:
                await run_attempt(self, routed, excluded)
                return
            except AttemptFailed as failure:
                if routed.request_id not in self._requests:
                    return  # aborted meanwhile
                if failure.stale:
                    self.num_stale_retries += 1
                else:
                    attempt += 1
                retry = failure.retry and attempt < MAX_ATTEMPTS and not routed.first_token_sent
                log.log(
                    logging.INFO if failure.stale else logging.WARNING,
                    "%s: attempt %d %s%s: %s%s",
                    routed.request_id,
                    attempt,
                    "refused (stale role epoch)" if failure.stale else "failed",
                    f" on {failure.blamed}" if failure.blamed else "",
                    failure,
                    "; retrying" if retry else "",
                )
                self._abort_on_instances(routed)
                if not retry:
                    self._fail(routed, str(failure), OVERLOADED if failure.overloaded else None)
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
            case TokenOutput() | CallError():  # a CallError: an instance refused a stream (a stale role epoch)
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
        if self._forget(routed):
            routed.stream.put(last)
            self._finished.set()

    def _fail(self, routed: RoutedRequest, error: str | None, error_kind: str | None = None) -> None:
        """End the request once as aborted (`error` None) or failed: every instance it touched
        is told, and its routing task stops."""
        if not self._forget(routed):
            return
        self._finished.set()
        self._abort_on_instances(routed)
        if routed.task is not None and routed.task is not asyncio.current_task():
            routed.task.cancel()
        routed.stream.put(RequestOutput.aborted(routed.request_id, error, len(routed.token_ids), error_kind))

    def _forget(self, routed: RoutedRequest) -> bool:
        """Drop a live request and its KV claim; False if it had ended already."""
        if self._requests.pop(routed.request_id, None) is None:
            return False
        self._by_wire.pop(routed.wire_id, None)
        self.kv_claims.release(routed.request_id)
        return True

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
