"""One try of one request across the cluster, top-down (see `Attempt.run`).

An `Attempt` holds what one try needs and nothing of the router: the instance registry, the
router's config, its counters, the table of try ids, and the request. It runs the try end to
end and returns the request's final output; the router finishes the request with it, or,
on `AttemptFailed`, decides whether to try again.

Every stage runs under `blame(instance)`: a failure there (the instance died, was declared
dead, timed out, refused, or ended the request with an error before any token reached the
caller) becomes an `AttemptFailed` naming that instance, which the router then leaves out of
the next try. That is the only place where blame is assigned. A refusal for a stale role
epoch (the instance switched roles after it was picked) is marked `stale`: not a failure,
just a try elsewhere. The epochs sent are those seen at pick time, so work picked for an
instance's old role can never be served in its new one.

The KV not arriving in the reservation (the transfer failed, the reservation's lease ran out
for want of prefill progress, the decode side could not load it) reaches the try one way: the
instance that saw it sends `KVFailed`, which the router puts in the try's KV fate
(try_state.py), the one thing the try awaits beside its prefill call and its stream. While
both instances live it is no instance's fault: it follows the router's `kv_load_failure`
policy, `recompute` (the decode instance prefills the prompt itself) or `fail` (the request
ends, saying why). If either died, that instance is blamed instead.

Each try has its own id on the instances (try_state.py:TryIds), so an instance that saw an earlier
try, and remembers it as aborted, never takes a later one for it. Every message of the try
carries `traceparent` (set by the tracing subscriber: its span, or its recompute's, as the
instances' parent; None untraced).

The try owns its state: the instances it picked, its placement, its stream, its KV's fate, and
how it ended (`outcome`, `reason`, `blamed`, `retried`, `output`; outcome.py). Each step of it is
published once, where it happens, on the router's event seam (request_events.py); what observes
requests (timelines, spans, the latency observer) subscribes there.

Longer than 400 lines because: the stages of one try read top-down in one place, each with the message it sends;
splitting them would scatter the blame and retry rules that tie them together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Iterator

from minipd.control.channel import ChannelClosed, RemoteError
from minipd.control.messages import (
    STALE_EPOCH,
    Abort,
    CallError,
    Decode,
    Generate,
    KVFailed,
    Message,
    Prefill,
    Prefilled,
    Reserve,
    Reserved,
)
from minipd.engine.request import FinishReason, RequestOutput, TransferInfo
from minipd.router.outcome import Outcome
from minipd.router.prefill_site import decide_placement
from minipd.router.registry import InstanceHandle, InstanceRegistry
from minipd.router.request_events import (
    DecodeBusy,
    FirstToken,
    KVReserved,
    PrefillFinished,
    PrefillStarted,
    Recompute,
    RequestEvents,
    ReserveSent,
    Routed,
    StreamStarted,
    TokensRelayed,
    TryEnded,
    TryStarted,
)
from minipd.router.routed_request import RoutedRequest
from minipd.router.router_config import RouterConfig
from minipd.router.router_counters import RouterCounters
from minipd.router.stream_waits import StreamWaits
from minipd.router.try_state import TryIds, TryState

log = logging.getLogger(__name__)

BUSY_RETRY_MIN_S = 0.01  # a full decode pool is asked again after this, doubling up to the max
BUSY_RETRY_MAX_S = 0.5


class InstanceFailed(RuntimeError):
    """An instance ended the request with an error before any token reached the caller."""


class KVLoadFailed(RuntimeError):
    """The KV of a try did not arrive in its reservation, both instances alive."""


class AttemptFailed(Exception):
    """One try failed: `outcome` says how (outcome.py: whether another try may succeed, whether
    it counts, the request's error kind); `blamed`: the instance at fault, left out of the next
    try (None when no instance is). A lost instance is named in the message."""

    def __init__(self, cause: BaseException, outcome: Outcome, blamed: str | None = None):
        message = str(cause)
        if outcome is Outcome.LOST and blamed is not None and blamed not in message:  # the client is told which
            message = f"{blamed}: {message}"
        super().__init__(message)
        self.cause, self.outcome, self.blamed = cause, outcome, blamed


@contextlib.contextmanager
def blame(instance: InstanceHandle, peer: InstanceHandle | None = None) -> Iterator[None]:
    """Turn a failure of a call on `instance` into `AttemptFailed` blaming it, or blaming
    `peer` (the other end of its KV transfer) when `peer` is what died."""
    try:
        yield
    except (ChannelClosed, TimeoutError, RemoteError, InstanceFailed) as exc:
        culprit = peer if peer is not None and not peer.is_alive else instance
        raise AttemptFailed(exc, _blamed_outcome(exc), culprit.instance_id) from exc


def _blamed_outcome(exc: BaseException) -> Outcome:
    if isinstance(exc, (ChannelClosed, TimeoutError)):  # its messages name the instance
        return Outcome.LOST
    if isinstance(exc, RemoteError) and exc.kind == "invalid":
        return Outcome.INVALID
    if isinstance(exc, RemoteError) and exc.kind == STALE_EPOCH:
        return Outcome.STALE
    return Outcome.FAILED


class Attempt(TryState):
    """Try `number` (1 for the first) of `routed`, never on an instance in `excluded` (those
    blamed for earlier tries); its steps are published on `events`. What it knows, and how
    it ended, is its `TryState`'s (try_state.py)."""

    def __init__(
        self,
        registry: InstanceRegistry,
        config: RouterConfig,
        counters: RouterCounters,
        try_ids: TryIds,
        events: RequestEvents,
        routed: RoutedRequest,
        excluded: set[str],
        number: int = 1,
    ):
        super().__init__(routed, number)
        self.registry, self.config, self.counters, self.try_ids = registry, config, counters, try_ids
        self.events, self.excluded = events, excluded

    def end(
        self,
        outcome: Outcome,
        reason: str | None,
        *,
        blamed: str | None = None,
        retried: bool = False,
        output: RequestOutput | None = None,
    ) -> None:
        """Record how the try ended (the router decides, once per try), and publish it."""
        self.outcome, self.reason, self.blamed, self.retried, self.output = outcome, reason, blamed, retried, output
        self.events.publish(TryEnded, self)

    async def run(self) -> RequestOutput:
        """pick → local or disaggregated → reserve → prefill → decode, streaming the decode
        instance's tokens to the caller; returns the final output. Raises AttemptFailed."""
        self.events.publish(TryStarted, self)
        registry, routed = self.registry, self.routed
        self.try_ids.begin(self)
        decode = registry.pick_decode(exclude=self.excluded)
        if decode is None:
            lost = "; ".join(registry.lost_decodes.values())  # each names its instance and how
            why = f"no decode instance available (lost: {lost})" if lost else "no decode instance available"
            raise AttemptFailed(ChannelClosed(why), Outcome.DECODES_LOST if lost else Outcome.NO_DECODE)
        hashes = registry.prompt_hashes(routed.token_ids)
        prefill, expected_cached = registry.pick_prefill(hashes, exclude=self.excluded)
        decode_epoch, prefill_epoch = decode.epoch, prefill.epoch if prefill is not None else None
        uncached_on_decode = len(routed.token_ids) - registry.overlap(decode, hashes) * registry.block_size
        candidates = registry.prefill_candidates(self.excluded)
        placement = decide_placement(
            decode,
            candidates,
            len(routed.token_ids),
            uncached_on_decode,
            routed.params.max_tokens,
            registry.block_size,
            self.config.local_prefill,
        )
        self.counters.placements[placement] += 1
        self.decode, self.prefill, self.placement = decode, prefill, placement
        self.local = routed.prefilled_locally = prefill is None or placement.is_local
        self.events.publish(Routed, self, decode, prefill, placement, uncached_on_decode, candidates)
        routed.instances = {decode.instance_id}
        decode.remember_prefix(hashes, decode.stats.num_blocks if decode.stats else len(hashes))
        with decode.counted():  # load is counted from the pick, so concurrent picks see it
            if self.local:
                return await self._prefill_locally(decode, decode_epoch)
            routed.instances.add(prefill.instance_id)
            self.kv_fate = asyncio.get_running_loop().create_future()  # before the Reserve: no report is missed
            try:
                with prefill.counted(len(routed.token_ids) - expected_cached):
                    with blame(decode):
                        reserved = await self._reserve(decode, prefill.instance_id, decode_epoch)
                    with blame(prefill, peer=decode):
                        first_token = await self._prefill_on(prefill, decode, reserved, prefill_epoch)
                routed.instances.discard(prefill.instance_id)
                prefill.remember_prefix(hashes, prefill.stats.num_blocks if prefill.stats else len(hashes))
                with blame(decode):
                    return await self._stream_from(
                        decode,
                        Decode(
                            request_id=routed.wire_id,
                            first_token=first_token,
                            sampling=routed.params,
                            traceparent=self.traceparent,
                        ),
                    )
            except KVLoadFailed as failure:
                return await self._kv_load_failed(prefill, decode, str(failure), decode_epoch)

    async def _prefill_locally(self, decode: InstanceHandle, epoch: int | None) -> RequestOutput:
        routed = self.routed
        with blame(decode):
            return await self._stream_from(
                decode,
                Generate(
                    request_id=routed.wire_id,
                    token_ids=routed.token_ids,
                    sampling=routed.params,
                    epoch=epoch,
                    traceparent=self.traceparent,
                ),
            )

    async def _kv_load_failed(
        self, prefill: InstanceHandle, decode: InstanceHandle, error: str, decode_epoch: int | None
    ) -> RequestOutput:
        """A KV failure (the try's KV fate resolved): blame an instance of the transfer that died
        (its fault, not the KV's); otherwise the `kv_load_failure` policy: end the request saying
        why, or have the decode instance prefill the prompt itself (its reservation dropped
        first; both instances are told)."""
        routed = self.routed
        what = f"the KV from {prefill.instance_id} did not load into {decode.instance_id}: {error}"
        self.kv_fate = None  # given up: a later report concerns nothing the try waits on
        dead = next((handle for handle in (prefill, decode) if not handle.is_alive), None)
        if dead is not None:
            raise AttemptFailed(KVLoadFailed(what), Outcome.FAILED, dead.instance_id)
        if self.config.kv_load_failure == "fail":
            raise AttemptFailed(KVLoadFailed(what), Outcome.KV_FAILED)
        log.warning("%s: %s; recomputing on %s", routed.request_id, what, decode.instance_id)
        self.counters.num_recomputes += 1
        for handle in (prefill, decode):
            handle.channel.send(Abort(request_id=routed.wire_id))
        routed.instances.discard(prefill.instance_id)
        routed.transfer = None
        self.local = routed.prefilled_locally = True
        self.try_ids.begin(self)  # the recompute is a try of its own, under a fresh id
        self.events.publish(Recompute, self, what)
        return await self._prefill_locally(decode, decode_epoch)

    async def _reserve(self, decode: InstanceHandle, prefill_id: str, epoch: int | None) -> Reserved:
        """Reserve blocks on `decode`. The decode instance is the authority on its own pool (several
        routers may share it): when it refuses ("busy") and another decode instance is left to
        try, the try ends so the next one goes there. On the last decode instance, wait for
        running requests to free blocks, backing off, up to `kv_wait_s`. Past that the request fails as overloaded,
        blaming no instance and not tried again: the cluster is out of KV capacity, which another
        try right away would not change (admission, `kv_admission_ratio`, keeps this rare). The
        time spent waiting is added to `routed.decode_wait_s`; the whole call's is `reserve_s`."""
        routed, config = self.routed, self.config
        loop = asyncio.get_running_loop()
        started = time.perf_counter()  # not loop.time(): uvloop's is whole milliseconds, and a reserve takes less
        deadline = loop.time() + config.kv_wait_s
        wait_s = BUSY_RETRY_MIN_S
        reserve = Reserve(
            request_id=routed.wire_id,
            token_ids=routed.token_ids,
            prefill_instance=prefill_id,
            epoch=epoch,
            traceparent=self.traceparent,
        )
        self.events.publish(ReserveSent, self)
        while True:
            try:
                sent = time.monotonic()
                reserved = await decode.channel.call(reserve, config.call_timeout_s)
                self.reserve_s = time.perf_counter() - started
                self.events.publish(KVReserved, self, reserved, sent)
                return reserved
            except RemoteError as exc:
                if exc.kind != "busy":
                    raise
                if self.registry.decode_candidates(self.excluded | {decode.instance_id}):
                    self.counters.num_busy_redirects += 1
                    raise AttemptFailed(
                        RuntimeError(f"{decode.instance_id} has no room for the prompt's KV ({exc})"),
                        Outcome.BUSY,
                        decode.instance_id,
                    ) from exc
                if loop.time() + wait_s > deadline:
                    raise AttemptFailed(
                        RuntimeError(
                            f"overloaded: {decode.instance_id} had no room for the prompt's KV "
                            f"within {config.kv_wait_s:g} s ({exc})"
                        ),
                        Outcome.OVERLOADED,
                    ) from exc
            self.counters.num_busy_waits += 1
            self.events.publish(DecodeBusy, self, wait_s)
            await asyncio.sleep(wait_s)  # back-off while the decode pool drains, not a synchronisation
            routed.decode_wait_s += wait_s
            wait_s = min(BUSY_RETRY_MAX_S, 2 * wait_s)

    async def _prefill_on(
        self, prefill: InstanceHandle, decode: InstanceHandle, reserved: Reserved, epoch: int | None
    ) -> int:
        """Prefill with the KV streamed into the reservation (the prefill instance renews its lease
        through the router while it progresses); returns the first token and records the
        transfer. Raises KVLoadFailed when the try's KV fate resolves first (either instance
        reported `KVFailed`: the prefill one answers that in place of the call's reply)."""
        routed = self.routed
        self.prefilling = prefill
        self.events.publish(PrefillStarted, self)
        call = asyncio.ensure_future(
            prefill.channel.call(
                Prefill(
                    request_id=routed.wire_id,
                    token_ids=routed.token_ids,
                    sampling=routed.params,
                    decode_instance=decode.instance_id,
                    decode_description=decode.welcome.transport_description,
                    decode_fingerprint=decode.welcome.fingerprint,
                    dst_block_ids=reserved.dst_block_ids,
                    num_skip_blocks=reserved.num_cached_tokens // self.registry.block_size,
                    layerwise=routed.layerwise,
                    epoch=epoch,
                    lease_s=reserved.lease_s,
                    traceparent=self.traceparent,
                    timeline=self.prefill_times_wanted,
                ),
                self.config.call_timeout_s,
            )
        )
        try:
            await asyncio.wait({call, self.kv_fate}, return_when=asyncio.FIRST_COMPLETED)
            if not call.done():
                raise KVLoadFailed(self.kv_fate.result().reason)
            prefilled: Prefilled = call.result()
            self.events.publish(PrefillFinished, self, prefilled)
        finally:
            call.cancel()
            self.prefilling = None
        routed.transfer = TransferInfo(
            prefill.instance_id,
            decode.instance_id,
            prefilled.num_bytes,
            prefilled.num_cached_tokens,
            reserved.num_cached_tokens,
            prefilled.compute_s,
            prefilled.transfer_s,
            prefilled.exposed_s,
            reserve_s=self.reserve_s,
        )
        routed.timestamps = (prefilled.compute_end_at, prefilled.first_write_at)
        return prefilled.first_token

    async def _stream_from(self, decode: InstanceHandle, message: Message) -> RequestOutput:
        """Send a streaming request and relay its outputs to the caller until the final one,
        which it returns; raises when the instance dies or no output comes within the
        inter-token timeout, and KVLoadFailed when the try's KV fate resolves first."""
        self.outputs = asyncio.Queue()
        self.events.publish(StreamStarted, self)
        decode.channel.send(message)
        waits = StreamWaits(decode, self.outputs, self.kv_fate)
        try:
            return await self._relay_stream(decode, waits)
        finally:
            waits.close()

    async def _relay_stream(self, decode: InstanceHandle, waits: StreamWaits) -> RequestOutput:
        """Relay what `waits` yields to the caller until the final output (`_stream_from`'s loop)."""
        routed = self.routed
        migratable = self.config.migration_limit > 0  # what migration needs is kept only when it is on
        while True:
            received = await waits.next(self.config.inter_token_timeout_s)
            if isinstance(received, KVFailed):
                raise KVLoadFailed(received.reason)
            if isinstance(received, CallError):  # refused in place of a stream (a stale role epoch)
                raise RemoteError(received)
            output = received.output
            output.request_id = routed.request_id  # instances know the try's id only
            if routed.continued_text is not None:  # migrated: the caller's request, not this try's
                output.num_prompt_tokens = len(routed.prompt_ids)
                output.num_output_tokens += routed.output_offset
                output.num_cached_tokens = min(output.num_cached_tokens, len(routed.prompt_ids))
                output.text, stopped = routed.continued_text.take(output.token_ids, output.finished)
                if stopped and not output.finished:  # on a stop string across the move: this try ends here
                    decode.channel.send(Abort(request_id=routed.wire_id))
                    output.finished, output.finish_reason = True, FinishReason.STOP.value
            if migratable:
                routed.num_text_sent += len(output.text)
            if output.error is not None and not routed.first_token_sent and not output.token_ids:
                raise InstanceFailed(output.error)
            if output.token_ids:
                if migratable:
                    routed.generated.extend(output.token_ids)
                self._relay(len(output.token_ids))
            if output.finished:
                output.transfer = routed.transfer
                return output
            routed.stream.put(output)

    def _relay(self, count: int) -> None:
        """`count` tokens are about to reach the caller (time.monotonic() stamps)."""
        routed, now = self.routed, time.monotonic()
        if routed.last_token_s is None:
            routed.first_token_s = routed.last_token_s = now
            self.events.publish(FirstToken, self, now)
            return
        gap_s = now - routed.last_token_s
        routed.num_later_tokens += count
        routed.last_token_s = now
        self.events.publish(TokensRelayed, self, now, count, gap_s)
