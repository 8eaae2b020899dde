"""An engine's making and its life outside a request: loading the model and allocating the KV
pool (`__init__`), the one compute thread, starting and closing the loop, and what is asked
of it between requests (waiting until it settles or goes idle, resetting its pool
for a role switch).

`EngineBase` is the half of `engine.Engine` that no request runs; a request's entry points
and the step loop are engine.py's. The state both halves share (the model, its pool and block
manager, the scheduler, the streams, the loop's events) is made here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from typing import Callable, Self

import msgspec
import torch

from minipd.engine import cpu_placement, kernel_caches
from minipd.engine.block_manager import BlockManager
from minipd.engine.config import EngineConfig, EngineStats
from minipd.engine.detokenizer import Detokenizer
from minipd.engine.dtype_choice import resolve_dtype
from minipd.engine.generator import GeneratesFromSubmit
from minipd.engine.kv_admission import KVClaims
from minipd.engine.kv_pool import allocate_kv_pool, parse_dtype
from minipd.engine.model_loader import load_model
from minipd.engine.model_runner import ModelRunner
from minipd.engine.request import Request
from minipd.engine.request_stream import RequestStream
from minipd.engine.scheduler import Scheduler
from minipd.engine.step_log import StepLog


class EngineBase(GeneratesFromSubmit):
    """The making and the life of an `Engine` (engine.py, which inherits this) outside requests."""

    def __init__(self, config: EngineConfig):
        """Loads the model and allocates the KV pool. `config.dtype` "auto" is resolved first:
        `self.config.dtype` is always the concrete dtype (`self.dtype_choice` says why), and
        `self.config.weights` the weight format the model serves ("quantized", "mixed" or "dense")."""
        config.validate()
        kernel_caches.bound()  # before any bf16 matmul of this process, loading included
        self.dtype_choice = resolve_dtype(config.dtype, config.device)
        config = msgspec.structs.replace(config, dtype=self.dtype_choice.name)
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = parse_dtype(config.dtype)
        # Every parallel torch op runs on this one thread, loading included: once a second
        # thread has run one, OpenMP keeps two thread teams and the forward pass slows down
        # about 2x on a small machine. Its placement is applied before its first torch op.
        self.placement = cpu_placement.resolve(config.torch_threads, config.cpus, config.cpu_placement)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="minipd-compute")
        try:
            self.run_on_compute_thread(cpu_placement.apply, self.placement)
            self.model, self.tokenizer = self.run_on_compute_thread(
                load_model, config.model, self.device, self.dtype, config.weights, config.quantized_kernel
            )
            self.config = config = msgspec.structs.replace(config, weights=self.model.weights_format)
            self.model_config = self.model.config
            if config.scheduler.max_model_len > self.model_config.max_position_embeddings:
                raise ValueError(
                    f"max_model_len ({config.scheduler.max_model_len}) exceeds the model's "
                    f"max_position_embeddings ({self.model_config.max_position_embeddings})"
                )
            self.kv_pool = self.run_on_compute_thread(
                allocate_kv_pool, self.model_config, config.num_blocks, config.block_size, self.dtype, self.device
            )
        except BaseException:
            self._executor.shutdown(wait=False)
            raise
        self.block_manager = BlockManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config.scheduler, self.block_manager)
        self.eos_token_ids = frozenset(self.model_config.eos_token_ids) | frozenset(self.tokenizer.eos_token_ids)
        self.runner = ModelRunner(
            self.model, self.kv_pool, self.eos_token_ids, config.fused_decode, config.prefill_kernels
        )
        self.detokenizer = Detokenizer(self.tokenizer)
        self._streams: dict[str, RequestStream] = {}
        self.kv_claims = KVClaims()  # of the live requests (kv_admission.py)
        self._pending_aborts: set[str] = set()
        self._ids = itertools.count()
        self._wakeup: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None  # set while the loop waits for work
        self._changed: asyncio.Event | None = None  # set (and replaced) at the end of every loop iteration
        self._loop_task: asyncio.Task | None = None
        # The step on the compute thread, while one runs: it reads its requests' tokens and blocks,
        # so nothing frees them until it is done (`close` waits for it).
        self._step: concurrent.futures.Future | None = None
        self.num_steps = 0  # engine steps run since start: how others tell this engine moves on
        self.step_log = StepLog(config.step_log) if config.step_log else None
        # Called on the loop with each request that finishes unaborted, while it still holds its
        # blocks (the KV tier's write-through takes its own reference on them: disagg/tier_wire.py).
        self.on_finished: Callable[[Request], None] | None = None
        # Called on the loop after each step that ran: (rows it ran, of which prompt tokens, its
        # forward pass in seconds); the KV tier learns the cost of computing a prompt from it.
        self.on_step: Callable[[int, int, float], None] | None = None

    def run_on_compute_thread(self, fn, *args):
        """Run `fn(*args)` on the compute thread and return its result (blocking; for set-up work)."""
        return self._executor.submit(fn, *args).result()

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        if self._loop_task is None:
            self._wakeup = asyncio.Event()
            self._idle = asyncio.Event()
            self._changed = asyncio.Event()
            self._loop_task = asyncio.create_task(self._run(), name="minipd-engine")

    async def close(self) -> None:
        """Abort every request, stop the loop and the compute thread. The aborts are applied
        (the requests' blocks freed) only once a step still on the compute thread has ended:
        cancelling the loop does not stop that step, which reads its requests' blocks and
        writes into them."""
        for request_id in list(self._streams):
            self.abort(request_id)
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            self._loop_task = None
            if self._step is not None:
                await asyncio.wait([asyncio.wrap_future(self._step)])
                self._step = None
            self._apply_aborts()
        self._executor.shutdown(wait=True)
        if self.step_log is not None:
            self.step_log.close()

    @property
    def is_running(self) -> bool:
        """True from `start()` until `close()`, while the engine loop is alive."""
        return self._loop_task is not None and not self._loop_task.done()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def wait_until(self, predicate: Callable[[EngineStats], bool], timeout: float) -> EngineStats | None:
        """Wait until `predicate(self.stats())` holds; the stats then, or None after `timeout`
        seconds. It is checked again after every iteration of the loop (a step, or the aborts
        and releases it applied before it waits for work), which is where stats change."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(stats := self.stats()):
            remaining = deadline - loop.time()
            if self._changed is None or remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                return None
        return stats

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until the engine has nothing to run (aborts applied); False on timeout."""
        if self._idle is None:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def reset_pool(self) -> None:
        """Forget the prefix cache: the pool is as it was at start, every block free. Only while
        the engine holds no request and no block is handed out (RuntimeError otherwise); the
        KV bytes are not cleared, since a block is always written before it is read."""
        if self._streams or self.scheduler.running or self.scheduler.waiting:
            raise RuntimeError(f"reset_pool: {len(self._streams)} requests are still in the engine")
        self.block_manager.reset()
