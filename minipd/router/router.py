"""The router: takes requests, picks instances, moves each request through the P/D lifecycle.

For one request (see DESIGN.md, "Request lifecycle"):
1. tokenize and validate; fix the sampling seed so prefill and decode sample alike;
2. pick a decode instance (free blocks, running requests) and a prefill instance (prefix
   overlap, queue load). A prompt of which the decode instance would have to compute at
   most `local_prefill_max_tokens` tokens itself (the rest being in its prefix cache) runs
   wholly there (conditional disaggregation), as does every prompt when there is no
   prefill instance;
3. `Reserve` on decode (blocks held before prefill starts), then `Prefill` on prefill, which
   streams the KV layer by layer into those blocks and answers with the first token;
4. `Decode` on decode, whose token stream the router relays to the caller.
If an instance dies before the first token, the request is retried once elsewhere. Aborts
reach every instance the request touched. The KV never passes through the router.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Callable, Sequence

import msgspec

from minipd.control.channel import Channel, ChannelClosed, RemoteError
from minipd.control.role import Role
from minipd.control.messages import (PROTOCOL_VERSION, Abort, Decode, Generate, GetStats, Hello, KVLanded, Message,
                               PeerLost, Prefill, Prefilled, Reserve, Reserved, Stats, TokenOutput, Welcome)
from minipd.router.registry import IncompatibleInstance, InstanceHandle, InstanceRegistry
from minipd.engine.prompt_check import prompt_token_ids
from minipd.engine.request import FinishReason, RequestOutput, TransferInfo
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
MAX_ATTEMPTS = 2  # the first try and one retry on other instances
BUSY_RETRY_MIN_S = 0.01  # a full decode pool is asked again after this, doubling up to the max
BUSY_RETRY_MAX_S = 0.5


class InstanceFailed(RuntimeError):
    """An instance ended the request with an error before any token reached the caller."""


class RouterConfig(msgspec.Struct, frozen=True, kw_only=True):
    local_prefill_max_tokens: int = 16  # uncached prompt tokens at or below which decode prefills itself
    layerwise: bool = True  # stream KV per layer during prefill, or send it all afterwards
    call_timeout_s: float = 120.0


class RoutedRequest:
    def __init__(self, request_id: str, token_ids: list[int], params: SamplingParams, stream: RequestStream):
        self.request_id = request_id
        self.token_ids = token_ids
        self.params = params
        self.stream = stream
        self.instances: set[str] = set()  # every instance that may hold state for it
        self.first_token_sent = False
        self.task: asyncio.Task | None = None
        self.transfer: TransferInfo | None = None
        self.timestamps = (0.0, 0.0)  # prefill's (compute end, first write), time.time()
        self.mode = ""  # "disaggregated" or "local"
        self.layerwise = True
        self.outputs: asyncio.Queue[RequestOutput] | None = None  # set while an instance streams it


class Router:
    def __init__(self, tokenizer, config: RouterConfig = RouterConfig(), model_name: str = "minipd"):
        self.tokenizer = tokenizer
        self.config = config
        self.model_name = model_name
        self.registry = InstanceRegistry()
        self._requests: dict[str, RoutedRequest] = {}
        self._ids = itertools.count()
        self._stats_task: asyncio.Task | None = None
        self.on_transfer: Callable[[TransferInfo], None] | None = None
        self._closing = False
        self.num_busy_waits = 0  # reservations retried because a decode pool was full

    # ---- instances --------------------------------------------------------------------
    async def add_instance(self, host: str, port: int, timeout: float = 30.0,
                           expected_role: Role | None = None) -> InstanceHandle:
        """Connect to an instance's control port, handshake, and register it.

        Raises IncompatibleInstance (fingerprint mismatch, saying what differs, or another role
        than `expected_role`), or ConnectionError/TimeoutError when it cannot be reached.
        """
        channel = await Channel.connect(host, port, self._on_message, f"router->{host}:{port}", timeout)
        try:
            welcome = await channel.call(Hello(protocol_version=PROTOCOL_VERSION, role=Role.ROUTER), timeout)
            if not isinstance(welcome, Welcome):
                raise IncompatibleInstance(f"{host}:{port} answered the handshake with {type(welcome).__name__}")
            if expected_role is not None and welcome.role is not expected_role:
                raise IncompatibleInstance(f"{host}:{port} is a {welcome.role.value} instance, not "
                                           f"{expected_role.value}")
            handle = InstanceHandle(welcome, channel, (host, port))
            self.registry.add(handle)
        except BaseException:
            await channel.close()
            raise
        handle.stats = await channel.call(GetStats(), timeout)
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
        return bool(self.registry.decode_candidates())

    def num_waiting(self) -> int:
        """Requests routed to a decode instance beyond what it runs at once (known without polling)."""
        return sum(max(0, h.num_inflight - h.welcome.max_num_seqs)
                   for h in self.registry.decode_candidates() if h.welcome.max_num_seqs)

    def instance_stats(self) -> list[Stats]:
        return [h.stats for h in self.registry.instances.values() if h.stats is not None and h.is_alive]

    async def refresh_stats(self, settle: bool = False) -> list[Stats]:
        """Ask every instance for fresh stats; with `settle`, after pending aborts have landed."""
        for handle in list(self.registry.instances.values()):
            try:
                handle.stats = await handle.channel.call(GetStats(settle=settle), self.config.call_timeout_s)
            except (ChannelClosed, TimeoutError, RemoteError):
                pass
        return self.instance_stats()

    async def close(self) -> None:
        self._closing = True
        if self._stats_task is not None:
            self._stats_task.cancel()
        for routed in list(self._requests.values()):
            self.abort(routed.request_id)
        for handle in list(self.registry.instances.values()):
            await handle.channel.close()

    # ---- requests ---------------------------------------------------------------------
    def submit(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
               request_id: str | None = None, layerwise: bool | None = None) -> RequestStream:
        """Validate and start routing; returns the stream of outputs (raises InvalidRequestError).

        `layerwise` overrides the router's KV streaming mode for this request (experiments)."""
        params = (params or SamplingParams()).with_seed()
        if not self.registry.instances:
            raise RuntimeError("the router has no instances")
        params.validate(self.vocab_size)
        token_ids = prompt_token_ids(self.tokenizer, prompt, self.vocab_size, self.max_model_len)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._requests:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        stream = RequestStream(request_id, self.abort)
        routed = RoutedRequest(request_id, token_ids, params, stream)
        routed.layerwise = self.config.layerwise if layerwise is None else layerwise
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
        self._finish(routed, FinishReason.ABORT, None)
        return True

    async def _route(self, routed: RoutedRequest) -> None:
        failed: set[str] = set()
        for attempt in range(MAX_ATTEMPTS):
            try:
                await self._attempt(routed, failed)
                return
            except (ChannelClosed, TimeoutError, RemoteError, InstanceFailed) as exc:
                if routed.request_id not in self._requests:
                    return  # aborted meanwhile
                retry = (attempt + 1 < MAX_ATTEMPTS and not routed.first_token_sent
                         and not (isinstance(exc, RemoteError) and exc.kind == "invalid"))
                log.warning("%s: attempt %d failed: %s%s", routed.request_id, attempt + 1, exc,
                            "; retrying" if retry else "")
                self._abort_on_instances(routed)
                if not retry:
                    self._finish(routed, FinishReason.ABORT, str(exc))
                    return
            except asyncio.CancelledError:
                return
            except Exception as exc:  # never leave a caller waiting on a stream that will not end
                log.exception("%s: routing failed", routed.request_id)
                self._abort_on_instances(routed)
                self._finish(routed, FinishReason.ABORT, f"internal error: {type(exc).__name__}")
                return

    async def _attempt(self, routed: RoutedRequest, failed: set[str]) -> None:
        decode = self.registry.pick_decode(exclude=failed)
        if decode is None:
            raise ChannelClosed("no decode instance available")
        decode.num_inflight += 1
        try:
            await self._attempt_on(decode, routed, failed)
        finally:
            decode.num_inflight -= 1

    async def _attempt_on(self, decode: InstanceHandle, routed: RoutedRequest, failed: set[str]) -> None:
        """One try. Whichever instance is being waited on when an exception escapes is added to
        `failed`, so a retry goes elsewhere."""
        registry = self.registry
        hashes = registry.prompt_hashes(routed.token_ids)
        prefill, expected_cached = registry.pick_prefill(hashes, exclude=failed)
        uncached_on_decode = len(routed.token_ids) - decode.prefix_overlap(hashes) * registry.block_size
        routed.instances = {decode.instance_id}
        decode.remember_prefix(hashes, decode.stats.num_blocks if decode.stats else len(hashes))
        if prefill is None or uncached_on_decode <= self.config.local_prefill_max_tokens:
            routed.mode = "local"
            failed.add(decode.instance_id)
            await self._run_on(decode, routed, Generate(request_id=routed.request_id, token_ids=routed.token_ids,
                                                        sampling=routed.params))
            return
        routed.mode = "disaggregated"
        routed.instances.add(prefill.instance_id)
        uncached = len(routed.token_ids) - expected_cached
        prefill.num_inflight += 1  # counted from the pick, so concurrent picks see the load
        prefill.num_inflight_tokens += uncached
        try:
            first_token = await self._prefill_remotely(routed, prefill, decode, hashes, failed)
        finally:
            prefill.num_inflight -= 1
            prefill.num_inflight_tokens -= uncached
        routed.instances.discard(prefill.instance_id)
        failed.add(decode.instance_id)
        await self._run_on(decode, routed, Decode(request_id=routed.request_id, first_token=first_token,
                                                  sampling=routed.params))

    async def _prefill_remotely(self, routed: RoutedRequest, prefill: InstanceHandle, decode: InstanceHandle,
                                hashes: list[int], failed: set[str]) -> int:
        """Reserve on decode, then prefill with the KV streamed into the reservation; returns the
        first token and records the transfer."""
        timeout = self.config.call_timeout_s
        failed.add(decode.instance_id)
        reserved = await self._reserve(decode, routed, prefill.instance_id)
        failed.discard(decode.instance_id)
        failed.add(prefill.instance_id)
        prefilled: Prefilled = await prefill.channel.call(Prefill(
            request_id=routed.request_id, token_ids=routed.token_ids, sampling=routed.params,
            decode_instance=decode.instance_id, decode_description=decode.welcome.transport_description,
            decode_fingerprint=decode.welcome.fingerprint, dst_block_ids=reserved.dst_block_ids,
            num_skip_blocks=reserved.num_cached_tokens // self.registry.block_size,
            layerwise=routed.layerwise), timeout)
        failed.discard(prefill.instance_id)
        prefill.remember_prefix(hashes, prefill.stats.num_blocks if prefill.stats else len(hashes))
        routed.transfer = TransferInfo(prefill.instance_id, decode.instance_id, prefilled.num_bytes,
                                       prefilled.num_cached_tokens, reserved.num_cached_tokens,
                                       prefilled.compute_s, prefilled.transfer_s, prefilled.exposed_s)
        routed.timestamps = (prefilled.compute_end_at, prefilled.first_write_at)
        if self.on_transfer is not None:
            self.on_transfer(routed.transfer)
        return prefilled.first_token

    async def _reserve(self, decode: InstanceHandle, routed: RoutedRequest, prefill_id: str) -> Reserved:
        """Reserve blocks on `decode`; while its pool is full ("busy"), wait for running requests
        to free blocks, backing off, up to the call timeout (then RemoteError)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.call_timeout_s
        wait_s = BUSY_RETRY_MIN_S
        while True:
            try:
                return await decode.channel.call(Reserve(request_id=routed.request_id, token_ids=routed.token_ids,
                                                         prefill_instance=prefill_id), self.config.call_timeout_s)
            except RemoteError as exc:
                if exc.kind != "busy" or loop.time() + wait_s > deadline:
                    raise
            self.num_busy_waits += 1
            await asyncio.sleep(wait_s)  # back-off while the decode pool drains, not a synchronisation
            wait_s = min(BUSY_RETRY_MAX_S, 2 * wait_s)

    async def _run_on(self, decode: InstanceHandle, routed: RoutedRequest, message: Message) -> None:
        """Send a streaming request and relay outputs until it finishes or the instance dies."""
        routed.outputs = asyncio.Queue()
        decode.channel.send(message)
        while True:
            output = await self._next_output(routed, decode)
            if output.error is not None and not routed.first_token_sent and not output.token_ids:
                raise InstanceFailed(output.error)
            routed.first_token_sent = routed.first_token_sent or bool(output.token_ids)
            if output.finished:
                output.transfer = routed.transfer
                self._finish(routed, None, None, output)
                return
            routed.stream.put(output)

    @staticmethod
    async def _next_output(routed: RoutedRequest, decode: InstanceHandle) -> RequestOutput:
        """The request's next output, or ChannelClosed if the instance dies first."""
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

    def _on_message(self, channel: Channel, message: Message) -> None:
        routed = self._requests.get(message.request_id)
        if isinstance(message, TokenOutput):
            if routed is not None and routed.outputs is not None:
                routed.outputs.put_nowait(message.output)
            return
        if isinstance(message, KVLanded):
            if routed is not None and routed.transfer is not None:
                routed.transfer = _with_landing(routed.transfer, routed.timestamps, message.landed_at)
            return
        log.warning("%s: unexpected %s", channel.name, type(message).__name__)

    def _finish(self, routed: RoutedRequest, reason: FinishReason | None, error: str | None,
                last: RequestOutput | None = None) -> None:
        """End the request once: the final output goes to the caller; an abort reaches the instances."""
        if self._requests.pop(routed.request_id, None) is None:
            return
        if last is None:
            last = RequestOutput(request_id=routed.request_id, token_ids=[], text="", finished=True,
                                 finish_reason=reason.value, num_prompt_tokens=len(routed.token_ids), error=error)
            self._abort_on_instances(routed)
            if routed.task is not None and routed.task is not asyncio.current_task():
                routed.task.cancel()
        routed.stream.put(last)

    def _abort_on_instances(self, routed: RoutedRequest) -> None:
        for instance_id in routed.instances:
            handle = self.registry.instances.get(instance_id)
            if handle is not None:
                handle.channel.send(Abort(request_id=routed.request_id))

    # ---- liveness ---------------------------------------------------------------------
    async def _watch(self, handle: InstanceHandle) -> None:
        await handle.channel.closed.wait()
        if self.registry.instances.get(handle.instance_id) is handle and not self._closing:
            self.registry.remove(handle.instance_id)
            log.warning("instance %s lost: %s", handle.instance_id, handle.channel.close_reason)
            for other in self.registry.instances.values():
                other.channel.send(PeerLost(instance_id=handle.instance_id, reason=handle.channel.close_reason))

    async def _poll_stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)  # periodic load report, not a synchronisation
            await self.refresh_stats()


def _with_landing(transfer: TransferInfo, timestamps: tuple[float, float], landed_at: float) -> TransferInfo:
    """Transfer figures measured to the receiver's landing time (the last byte acknowledged),
    which replace the sender's view; both clocks are wall clocks, exact on one host."""
    compute_end_at, first_write_at = timestamps
    return msgspec.structs.replace(transfer, transfer_s=max(0.0, landed_at - first_write_at),
                                   exposed_s=max(0.0, landed_at - compute_end_at))
