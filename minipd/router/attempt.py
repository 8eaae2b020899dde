"""One try of one request across the cluster, top-down (see `run_attempt`).

Every stage runs under `blame(instance)`: a failure there (the instance died, timed out,
refused, or ended the request with an error before any token reached the caller) becomes an
`AttemptFailed` naming that instance, which the router then leaves out of the next try. That
is the only place where blame is assigned. A refusal for a stale role epoch (the instance
switched roles after it was picked) is marked `stale`: not a failure, just a try elsewhere.

The epochs sent are those seen at pick time, so work picked for an instance's old role can
never be served in its new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Callable, Iterator

from minipd.control.channel import ChannelClosed, RemoteError
from minipd.control.messages import (STALE_EPOCH, CallError, Decode, Generate, Message, Prefill, Prefilled, Renew,
                                     Reserve, Reserved)
from minipd.engine.request import RequestOutput, TransferInfo
from minipd.router.latency_observer import relay_tokens
from minipd.router.placement import decide_placement
from minipd.router.registry import InstanceHandle
from minipd.router.routed_request import RoutedRequest

if TYPE_CHECKING:
    from minipd.router.router import Router

log = logging.getLogger(__name__)

BUSY_RETRY_MIN_S = 0.01  # a full decode pool is asked again after this, doubling up to the max
BUSY_RETRY_MAX_S = 0.5
RENEWALS_PER_LEASE = 3  # a reservation's lease is renewed this often per lease while its prefill runs


class InstanceFailed(RuntimeError):
    """An instance ended the request with an error before any token reached the caller."""


class AttemptFailed(Exception):
    """One try failed. `blamed`: the instance at fault, left out of the next try (None when no
    instance is); `retry`: whether another try may succeed (False for a request refused as
    invalid, which would be refused anywhere); `stale`: refused for a stale role epoch."""

    def __init__(self, cause: BaseException, blamed: str | None, retry: bool = True, stale: bool = False):
        super().__init__(str(cause))
        self.cause, self.blamed, self.retry, self.stale = cause, blamed, retry, stale


@contextlib.contextmanager
def blame(instance: InstanceHandle, peer: InstanceHandle | None = None,
          peer_at_fault: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Turn a failure of a call on `instance` into `AttemptFailed` blaming it, or blaming
    `peer` (the other end of its KV transfer) when `peer` is what died or `peer_at_fault()`."""
    try:
        yield
    except (ChannelClosed, TimeoutError, RemoteError, InstanceFailed) as exc:
        culprit = peer if peer is not None and (not peer.is_alive or peer_at_fault()) else instance
        invalid = isinstance(exc, RemoteError) and exc.kind == "invalid"
        stale = isinstance(exc, RemoteError) and exc.kind == STALE_EPOCH
        raise AttemptFailed(exc, culprit.instance_id, retry=not invalid, stale=stale) from exc


async def run_attempt(router: Router, routed: RoutedRequest, excluded: set[str]) -> None:
    """pick → local or disaggregated → reserve → prefill → decode, streaming the decode
    instance's tokens to the caller. Raises AttemptFailed."""
    registry, config = router.registry, router.config
    decode = registry.pick_decode(exclude=excluded)
    if decode is None:
        raise AttemptFailed(ChannelClosed("no decode instance available"), None, retry=False)
    hashes = registry.prompt_hashes(routed.token_ids)
    prefill, expected_cached = registry.pick_prefill(hashes, exclude=excluded)
    decode_epoch, prefill_epoch = decode.epoch, prefill.epoch if prefill is not None else None
    uncached_on_decode = len(routed.token_ids) - decode.prefix_overlap(hashes) * registry.block_size
    placement = decide_placement(decode, registry.prefill_candidates(excluded), len(routed.token_ids),
                                 uncached_on_decode, routed.params.max_tokens, registry.block_size,
                                 config.local_prefill)
    router.placements[placement] += 1
    routed.prefilled_locally = prefill is None or placement.is_local
    routed.instances = {decode.instance_id}
    decode.remember_prefix(hashes, decode.stats.num_blocks if decode.stats else len(hashes))
    with decode.counted():  # load is counted from the pick, so concurrent picks see it
        if prefill is None or placement.is_local:
            with blame(decode):
                await stream_from(router, decode, routed, Generate(
                    request_id=routed.request_id, token_ids=routed.token_ids, sampling=routed.params,
                    epoch=decode_epoch))
            return
        routed.instances.add(prefill.instance_id)
        with prefill.counted(len(routed.token_ids) - expected_cached):
            with blame(decode):
                reserved = await reserve(router, decode, routed, prefill.instance_id, decode_epoch)
            with blame(prefill, peer=decode):
                first_token = await prefill_on(router, prefill, decode, reserved, routed, prefill_epoch)
        routed.instances.discard(prefill.instance_id)
        prefill.remember_prefix(hashes, prefill.stats.num_blocks if prefill.stats else len(hashes))
        # the KV not landing is the sender's failure (or its link's), not the receiver's
        with blame(decode, peer=prefill, peer_at_fault=lambda: routed.kv_load_failed):
            await stream_from(router, decode, routed, Decode(
                request_id=routed.request_id, first_token=first_token, sampling=routed.params))


async def reserve(router: Router, decode: InstanceHandle, routed: RoutedRequest, prefill_id: str,
                  epoch: int | None = None) -> Reserved:
    """Reserve blocks on `decode`; while its pool is full ("busy"), wait for running requests
    to free blocks, backing off, up to `kv_wait_s`. Past that the request fails as overloaded,
    blaming no instance and not tried again: the cluster is out of KV capacity, which another
    try right away would not change (admission, `kv_admission_ratio`, keeps this rare). The
    time spent waiting is added to `routed.decode_wait_s`."""
    loop = asyncio.get_running_loop()
    timeout = router.config.call_timeout_s
    deadline = loop.time() + router.config.kv_wait_s
    wait_s = BUSY_RETRY_MIN_S
    while True:
        try:
            return await decode.channel.call(Reserve(request_id=routed.request_id, token_ids=routed.token_ids,
                                                     prefill_instance=prefill_id, epoch=epoch), timeout)
        except RemoteError as exc:
            if exc.kind != "busy":
                raise
            if loop.time() + wait_s > deadline:
                raise AttemptFailed(RuntimeError(f"overloaded: {decode.instance_id} had no room for the prompt's KV "
                                                 f"within {router.config.kv_wait_s:g} s ({exc})"), None,
                                    retry=False) from exc
        router.num_busy_waits += 1
        await asyncio.sleep(wait_s)  # back-off while the decode pool drains, not a synchronisation
        routed.decode_wait_s += wait_s
        wait_s = min(BUSY_RETRY_MAX_S, 2 * wait_s)


async def prefill_on(router: Router, prefill: InstanceHandle, decode: InstanceHandle, reserved: Reserved,
                     routed: RoutedRequest, epoch: int | None = None) -> int:
    """Prefill with the KV streamed into the reservation, renewing its lease meanwhile; returns
    the first token and records the transfer."""
    renewals = asyncio.get_running_loop().create_task(_renew_lease(decode, routed.request_id, reserved.lease_s))
    try:
        prefilled: Prefilled = await prefill.channel.call(Prefill(
            request_id=routed.request_id, token_ids=routed.token_ids, sampling=routed.params,
            decode_instance=decode.instance_id, decode_description=decode.welcome.transport_description,
            decode_fingerprint=decode.welcome.fingerprint, dst_block_ids=reserved.dst_block_ids,
            num_skip_blocks=reserved.num_cached_tokens // router.registry.block_size,
            layerwise=routed.layerwise, epoch=epoch), router.config.call_timeout_s)
    except RemoteError as exc:
        if exc.kind == "transfer":
            router.note_transfer_failure(f"{prefill.instance_id} -> {decode.instance_id}: {exc}")
        raise
    finally:
        renewals.cancel()
    routed.transfer = TransferInfo(prefill.instance_id, decode.instance_id, prefilled.num_bytes,
                                   prefilled.num_cached_tokens, reserved.num_cached_tokens,
                                   prefilled.compute_s, prefilled.transfer_s, prefilled.exposed_s)
    routed.timestamps = (prefilled.compute_end_at, prefilled.first_write_at)
    return prefilled.first_token


async def _renew_lease(decode: InstanceHandle, request_id: str, lease_s: float) -> None:
    """While a prefill is under way the reservation is in use: keep it from expiring. The
    renewals stop with the prefill call, which has a timeout, so no lease is held forever."""
    while True:
        await asyncio.sleep(lease_s / RENEWALS_PER_LEASE)  # periodic renewal, not a synchronisation
        decode.channel.send(Renew(request_id=request_id))


async def stream_from(router: Router, decode: InstanceHandle, routed: RoutedRequest, message: Message) -> None:
    """Send a streaming request and relay its outputs to the caller until it finishes or the
    instance dies."""
    routed.outputs = asyncio.Queue()
    decode.channel.send(message)
    while True:
        output = await _next_output(routed, decode)
        if isinstance(output, CallError):  # refused in place of a stream (a stale role epoch)
            raise RemoteError(output)
        if output.error is not None and not routed.first_token_sent and not output.token_ids:
            raise InstanceFailed(output.error)
        routed.first_token_sent = routed.first_token_sent or bool(output.token_ids)
        if output.token_ids:
            relay_tokens(router.latency_observer, routed, len(output.token_ids))
        if output.finished:
            output.transfer = routed.transfer
            router.finish(routed, output)
            return
        routed.stream.put(output)


async def _next_output(routed: RoutedRequest, decode: InstanceHandle) -> RequestOutput | CallError:
    """The request's next output (or the refusal of its stream), or ChannelClosed if the
    instance dies first."""
    get = asyncio.ensure_future(routed.outputs.get())
    closed = asyncio.ensure_future(decode.channel.closed.wait())
    try:
        done, _ = await asyncio.wait({get, closed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        get.cancel()
        closed.cancel()
    if get not in done:
        raise ChannelClosed(f"{decode.instance_id} died: {decode.channel.close_reason}")
    return get.result()
