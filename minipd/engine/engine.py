"""The asyncio engine: one instance's model, KV pool, scheduler and streaming outputs.

The engine loop, top-down, one step at a time:
1. apply aborts that arrived since the last step;
2. ask the scheduler for a batch (or sleep until a request arrives);
3. run the forward pass and sampling on the single compute thread, so the event loop keeps
   serving I/O while the model runs;
4. advance progress, append sampled tokens, check stop conditions, stream increments.
One request's failure never fails the others of its step (`ModelRunner.execute`).

All scheduler and request state is touched only on the event loop thread.

The request entry points (submit, prefill-only, reserve/adopt for KV that arrives) and the
loop share one scheduler, one set of streams and one pool, and are read together here; the
engine's making and its life outside requests are engine_base.py's, the configuration is in
config.py, the forward pass in model_runner.py."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

import msgspec
import torch

from minipd.engine import kv_sink
from minipd.engine.checked_prompt import CheckedPrompt, accept_prompt
from minipd.engine.config import EngineConfig, EngineStats
from minipd.engine.engine_base import EngineBase
from minipd.engine.kv_admission import NoCapacity, claim_blocks
from minipd.engine.kv_sink import KVSink
from minipd.engine.min_tokens import stops_active
from minipd.engine.model_runner import ChunkResult, StepFailed
from minipd.engine.request import FinishReason, Request, RequestOutput, RequestStatus
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams
from minipd.engine.scheduler import SchedulerOutput
from minipd.engine.step_log import StepLog

log = logging.getLogger(__name__)

__all__ = ["Engine", "EngineConfig", "EngineStats", "NoCapacity"]


class Engine(EngineBase):
    """One instance's engine; `submit`/`generate` have the shape every runner of requests
    shares (generator.py). Its making and its life outside requests are `EngineBase`'s
    (engine_base.py)."""

    # ---- requests ---------------------------------------------------------------------
    def make_request(
        self,
        prompt: str | Sequence[int] | CheckedPrompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> Request:
        """Validate (a checked prompt: its invariants only, checked_prompt.py) and tokenize;
        raises InvalidRequestError naming the bad field."""
        checked = accept_prompt(
            self.tokenizer, prompt, params, self.model_config.vocab_size, self.config.scheduler.max_model_len
        )
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        return Request(request_id, checked.token_ids, checked.params.with_seed())

    def submit(
        self,
        prompt: str | Sequence[int] | CheckedPrompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        kv_limit_blocks: int | None = None,
    ) -> RequestStream:
        """Validate, enqueue and return the request's output stream. With `kv_limit_blocks`,
        raise NoCapacity instead when the KV claims of the live requests and this one would
        exceed it (kv_admission.py)."""
        request = self.make_request(prompt, params, request_id)
        return self._enqueue(request, kv_limit_blocks)

    def submit_prefill(
        self, token_ids: Sequence[int], params: SamplingParams, request_id: str, sink: KVSink
    ) -> RequestStream:
        """Prefill only: compute the prompt's KV (in chunks, like any prompt), sample the first
        token, and hand the KV to `sink` (see kv_sink.py). The stream yields that one token.
        The prompt comes from a router, which validated it: only its invariants are checked."""
        checked = CheckedPrompt(list(token_ids), msgspec.structs.replace(params, max_tokens=1))
        request = self.make_request(checked, None, request_id)
        request.kv_sink = sink
        return self._enqueue(request)

    def reserve(self, token_ids: Sequence[int]) -> tuple[list[int], int]:
        """Blocks for a prompt whose KV will arrive from a prefill instance (decode role).

        Returns (block ids for the whole prompt, leading tokens already held here thanks to the
        prefix cache). The caller owns the blocks: `adopt` them or `release_blocks` them.
        Raises NoCapacity unless the blocks are free beyond those the queued requests need for
        their next step: a reservation is the newest request, so it may not take those.
        """
        if len(token_ids) >= self.config.scheduler.max_model_len:
            raise InvalidRequestError(
                "prompt", f"{len(token_ids)} tokens; max_model_len is {self.config.scheduler.max_model_len}"
            )
        bm = self.block_manager
        if bm.blocks_for(len(token_ids)) > bm.num_blocks:
            raise InvalidRequestError(
                "prompt", f"{len(token_ids)} tokens need more blocks than this instance's whole pool ({bm.num_blocks})"
            )
        needed, spare = bm.num_new_blocks_for(token_ids), self.scheduler.spare_blocks()
        if needed > spare:
            raise NoCapacity(
                f"{needed} blocks needed, {bm.num_free_blocks} free of which queued requests need "
                f"{bm.num_free_blocks - spare}"
            )
        return bm.allocate(token_ids)

    def adopt(
        self,
        token_ids: Sequence[int],
        block_ids: list[int],
        num_cached_tokens: int,
        first_token: int,
        params: SamplingParams,
        request_id: str,
    ) -> RequestStream:
        """Continue a request whose prompt KV is in `block_ids` (received) and whose first token
        was sampled elsewhere; takes ownership of the blocks. The stream starts with `first_token`.
        The prompt comes from a router, which validated it: only its invariants are checked."""
        request = self.make_request(CheckedPrompt(list(token_ids), params), None, request_id)
        if not 0 <= first_token < self.model_config.vocab_size:
            raise InvalidRequestError("first_token", f"{first_token} outside the vocabulary")
        request.block_ids = block_ids
        request.num_computed_tokens = request.num_tokens
        request.num_cached_tokens = num_cached_tokens
        self.block_manager.register_computed(block_ids, request.token_ids, request.num_tokens)
        stream = self._enqueue(request)
        self._append_token(request, first_token)
        return stream

    def release_blocks(self, block_ids: Sequence[int]) -> None:
        """Give back blocks handed out by `reserve` or to a KV sink."""
        self.block_manager.free(block_ids)
        if self._wakeup is not None:  # a request waiting for blocks may run now
            self._wakeup.set()

    def _enqueue(self, request: Request, kv_limit_blocks: int | None = None) -> RequestStream:
        if self._loop_task is None:
            raise RuntimeError("engine not started: use `async with Engine(...)` or `await engine.start()`")
        claim = claim_blocks(
            request.num_prompt_tokens,
            request.sampling.max_tokens,
            self.config.scheduler.max_model_len,
            self.config.block_size,
        )
        self.kv_claims.admit(request.request_id, claim, kv_limit_blocks)
        stream = RequestStream(request.request_id, self.abort, request)
        self._streams[request.request_id] = stream
        self.scheduler.add(request)
        self._idle.clear()
        self._wakeup.set()
        return stream

    def abort(self, request_id: str) -> bool:
        """Abort a running or waiting request; False if it is unknown or already finished."""
        if request_id not in self._streams:
            return False
        self._pending_aborts.add(request_id)
        self._idle.clear()
        self._wakeup.set()
        return True

    def _notify_changed(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def stats(self) -> EngineStats:
        """What the engine holds now (its instance reports it in every stats poll)."""
        return EngineStats(
            len(self.scheduler.running),
            len(self.scheduler.waiting),
            self.scheduler.num_preemptions,
            self.block_manager.usage(),
            num_prefilling=self.scheduler.num_prefilling(),
        )

    # ---- the loop ---------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            step_start = time.perf_counter()
            self._apply_aborts()
            output = self.scheduler.schedule()
            if not output.chunks:
                self._notify_changed()
                self._wakeup.clear()
                self._idle.set()
                await self._wakeup.wait()
                self._idle.clear()
                continue
            calls = kv_sink.sink_calls(output.chunks)
            hook = kv_sink.layer_notifier(loop, calls, self._wait_for_device) if calls else None
            shape = StepLog.shape(output.chunks) if self.step_log is not None else None
            forward_start = time.perf_counter()
            try:
                self._step = self._executor.submit(self.runner.execute, output.chunks, hook)
                results = await asyncio.wrap_future(self._step)
            except Exception as exc:  # the runner fails chunks, not steps; this is a last resort
                log.exception("engine step failed")
                results = [StepFailed(f"engine step failed: {type(exc).__name__}: {exc}")] * len(output.chunks)
            self.num_steps += 1
            forward_end = time.perf_counter()
            if self.on_step is not None:
                self._observe_step(output, forward_end - forward_start)
            self._process(output, results, (forward_start, forward_end))
            if shape is not None:
                self.step_log.record(shape, step_start, time.perf_counter())
            self._notify_changed()

    def _observe_step(self, output: SchedulerOutput, seconds: float) -> None:
        """`on_step` for a step that ran, before its progress is applied."""
        prompt = sum(
            max(0, min(c.num_new_tokens, c.request.num_prompt_tokens - c.request.num_computed_tokens))
            for c in output.chunks
        )
        try:
            self.on_step(output.num_tokens, prompt, seconds)
        except Exception:  # an observer's failure is not the step's
            log.exception("on_step failed")

    @property
    def _wait_for_device(self) -> Callable[[], None] | None:
        """What a layer hook must wait for before a transfer may read the pool: on CUDA, the
        layer's write on the compute stream (transfers read from other streams and threads)."""
        if self.device.type != "cuda":
            return None
        device = self.device
        return lambda: torch.cuda.current_stream(device).synchronize()

    def _process(self, output: SchedulerOutput, results: list[ChunkResult], step: tuple[float, float]) -> None:
        """Advance the chunks that ran, append their sampled tokens, and fail those that failed
        (their progress stays where it was)."""
        ran = [c for c, r in zip(output.chunks, results, strict=True) if not isinstance(r, Exception)]
        for chunk in ran:
            chunk.request.record_step(*step)
        self.scheduler.update_computed(SchedulerOutput(ran, output.preempted))
        for chunk, result in zip(output.chunks, results, strict=True):
            if isinstance(result, Exception):  # this request alone fails
                log.error("request %s: %s", chunk.request.request_id, result)
                self._emit(chunk.request, FinishReason.ABORT, error=str(result))
            elif chunk.samples:
                self._append_token(chunk.request, result)

    def _append_token(self, request: Request, token: int) -> None:
        if request.status is RequestStatus.FINISHED:
            return
        params = request.sampling
        request.token_ids.append(token)
        active = stops_active(params, request.num_output_tokens)
        is_stop_token = active and (
            token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids)
        )
        finish = self.detokenizer.update(request, token, is_stop_token, active)
        if finish is None and (
            request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.config.scheduler.max_model_len
        ):
            finish = FinishReason.LENGTH
        self._emit(request, finish)

    def _emit(self, request: Request, finish: FinishReason | None, error: str | None = None) -> None:
        stream = self._streams.get(request.request_id)
        if finish is not None:
            self._finish(request, finish, error)
            self._streams.pop(request.request_id, None)
            self.kv_claims.release(request.request_id)
        if stream is None:
            return
        new_tokens = request.output_token_ids[request.num_tokens_sent :]
        request.num_tokens_sent = request.num_output_tokens
        text = self.detokenizer.take_text(request, finished=finish is not None)
        if not new_tokens and not text and finish is None:
            return
        stream.put(
            RequestOutput(
                request_id=request.request_id,
                token_ids=new_tokens,
                text=text,
                finished=finish is not None,
                finish_reason=None if finish is None else finish.value,
                num_prompt_tokens=request.num_prompt_tokens,
                num_output_tokens=request.num_output_tokens,
                num_cached_tokens=request.num_cached_tokens,
                error=error,
                queue_time_s=request.queue_time_s,
            )
        )

    def _finish(self, request: Request, finish: FinishReason, error: str | None) -> None:
        if finish is not FinishReason.ABORT and self.on_finished is not None:
            try:
                self.on_finished(request)
            except Exception:  # an observer's failure is not the request's
                log.exception("on_finished failed for %s", request.request_id)
        if request.kv_sink is None:
            self.scheduler.finish(request)
        else:
            kv_sink.hand_off(request, self.scheduler, finish is not FinishReason.ABORT, error)

    def _apply_aborts(self) -> None:
        if not self._pending_aborts:
            return
        for request_id in self._pending_aborts:
            stream = self._streams.get(request_id)
            if stream is not None:
                self._emit(stream.request, FinishReason.ABORT)
        self._pending_aborts.clear()
