"""Sends one request's prompt KV from a prefill instance into a decode instance's reserved blocks.

Layer-wise (the default): the moment layer i's K/V is written, the blocks of layer i that
became final go out while layer i+1 computes, so only the last layer's transfer is exposed
after compute. A prompt prefilled in chunks sends, after each chunk's layer i, the blocks that
chunk completed (a block only partly filled waits for the next chunk; the last chunk sends
the rest), so no block is sent twice. The alternative, `layerwise=False`, sends every layer
after the last chunk (for comparison).

Blocks the decode instance already holds (its prefix cache) are skipped; blocks found in the
prefill instance's own prefix cache are sent like computed ones.

Traced (a prefill `span` given), each chunk is a child span of it (its first layer written
to its last), and the transfer one more (first write to the last completed), with an event
per layer handed to the transport and per layer whose write completed (kv_trace.py). Asked for
the router's request timelines (`times` given), the same points are timed (prefill_times.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import NamedTuple

from minipd.disagg.kv_trace import KVTrace
from minipd.disagg.prefill_times import PrefillTimesRecorder
from minipd.engine.engine import Engine
from minipd.engine.request import Request
from minipd.tracing.spans import Span
from minipd.transports import fault_points
from minipd.transports.base import Transport
from minipd.transports.block_run import coalesce_runs
from minipd.transports.transfer_error import TransferError


class SendReport(NamedTuple):
    first_token: int
    num_bytes: int
    compute_s: float  # the prefill step
    transfer_s: float  # first write issued to the last write completed here
    exposed_s: float  # end of compute to the last write completed here
    compute_end_at: float  # time.time(), comparable with the receiver's landing time
    first_write_at: float  # time.time()


log = logging.getLogger(__name__)


class PrefillFailed(RuntimeError):
    pass


class LayerwiseKVSender:
    """A `KVSink` (see kv_sink.py). `result` resolves to a SendReport or raises. Once a write
    fails (the peer is gone), the transfer is over: `result` raises that TransferError and
    later layers are not sent."""

    def __init__(
        self,
        engine: Engine,
        transport: Transport,
        peer_id: str,
        request_id: str,
        dst_block_ids: list[int],
        num_skip_blocks: int,
        layerwise: bool = True,
        span: Span | None = None,
        times: PrefillTimesRecorder | None = None,
    ):
        self.engine, self.transport = engine, transport
        self.peer_id, self.request_id = peer_id, request_id
        self.dst_block_ids, self.num_skip_blocks = dst_block_ids, num_skip_blocks
        self.layerwise = layerwise
        self.num_layers = engine.model_config.num_layers
        self.block_size = engine.config.block_size
        self.request: Request | None = None  # set by the caller right after submitting
        self.result: asyncio.Future[SendReport] = asyncio.get_running_loop().create_future()
        self._num_sent = [num_skip_blocks] * self.num_layers  # leading blocks of each layer sent
        self._first_write_time: float | None = None
        self.trace = KVTrace(span, self.num_layers) if span is not None else None
        self.times = times

    def on_layer(self, layer: int, num_final_tokens: int) -> None:
        if layer == 0 and self._first_write_time is None:
            fault_points.hit("prefill.computing", self.request_id)
        if self.trace is not None:
            self.trace.on_layer(layer, num_final_tokens)
        if self.times is not None:
            self.times.on_layer(layer)
        if self.layerwise and not self.result.done():
            try:
                self._send_final(layer, self.request.block_ids, num_final_tokens)
            except TransferError as exc:
                log.warning("KV of %s not sent from layer %d on: %s", self.request_id, layer, exc)
                self.result.set_exception(exc)

    def on_prefilled(self, first_token: int, block_ids: list[int], compute: tuple[float, float]) -> None:
        if not self.layerwise:
            for layer in range(self.num_layers):
                self._send_final(layer, block_ids, self.request.num_prompt_tokens)
        asyncio.get_running_loop().create_task(self._finish(first_token, block_ids, compute))

    def on_failed(self, reason: str) -> None:
        if self.trace is not None:
            self.trace.failed(reason)
        if not self.result.done():
            self.result.set_exception(PrefillFailed(reason))
        asyncio.get_running_loop().create_task(self.transport.abort(self.request_id, peer_id=self.peer_id))

    def _send_final(self, layer: int, block_ids: list[int], num_final_tokens: int) -> None:
        """Send the blocks of `layer` that the first `num_final_tokens` prompt tokens fill and
        that have not gone out yet (all of them, the last partial one too, once the whole
        prompt is final)."""
        if self._first_write_time is None:
            if len(block_ids) - self.num_skip_blocks != len(self.dst_block_ids):
                raise ValueError(
                    f"{len(block_ids) - self.num_skip_blocks} blocks to send but {len(self.dst_block_ids)} reserved"
                )
            self._first_write_time = time.perf_counter()
        whole_prompt = num_final_tokens >= self.request.num_prompt_tokens
        end = len(block_ids) if whole_prompt else num_final_tokens // self.block_size
        start = self._num_sent[layer]
        if end <= start:
            return
        self._num_sent[layer] = end
        skip = self.num_skip_blocks
        runs = coalesce_runs(block_ids[start:end], self.dst_block_ids[start - skip : end - skip])
        write = self.transport.write_layer(self.peer_id, self.request_id, layer, runs)
        if self.trace is not None:
            self.trace.layer_sent(layer, end - start, write)
        if self.times is not None:
            self.times.layer_sent(layer, write)

    async def _finish(self, first_token: int, block_ids: list[int], compute: tuple[float, float]) -> None:
        try:
            sent = await self.transport.finish_request(self.peer_id, self.request_id)
            done = time.perf_counter()
            if not self.result.done():
                first_write = self._first_write_time or compute[1]
                to_wall = time.time() - time.perf_counter()
                report = SendReport(
                    first_token,
                    sent.num_bytes,
                    compute[1] - compute[0],
                    done - first_write,
                    max(0.0, done - compute[1]),
                    compute[1] + to_wall,
                    first_write + to_wall,
                )
                if self.trace is not None:
                    self.trace.sent(report.num_bytes, report.transfer_s, report.exposed_s)
                if self.times is not None:
                    self.times.finished(compute)
                self.result.set_result(report)
        except Exception as exc:
            if self.trace is not None:
                self.trace.failed(str(exc))
            if not self.result.done():
                self.result.set_exception(exc)
        finally:
            self.engine.release_blocks(block_ids)
