"""The engine's one seam for requests whose KV leaves the instance (the prefill role).

A request submitted with a sink (`Engine.submit_prefill`) is scheduled like any other prompt,
chunked prefill included, and samples one token. The engine calls its sink on the event loop:
1. `on_layer(layer, num_final_tokens)` once per layer of every step that ran a chunk of it,
   as soon as that layer's K/V for the step is written into the pool (posted from the compute
   thread while later layers still compute): the KV of the prompt's first
   `num_final_tokens` tokens in that layer is final from then on;
2. `on_prefilled(first_token, block_ids, compute)` once, after the step that ran the last
   chunk, with the sampled first token and the (start of the first step, end of the last)
   `time.perf_counter()` stamps. From then on the sink owns `block_ids` (the engine does not
   free them) and must give them back with `Engine.release_blocks` once no transfer reads
   them any more.
If the request is aborted or fails before step 2, `on_failed(reason)` is called instead and the
engine frees the blocks itself. Such a request is never preempted: its blocks are allocated
whole at admission (it needs no more), and a transfer may be reading them.

Everything the engine core does differently for such requests is in this module.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

if TYPE_CHECKING:
    from minipd.engine.request import Request
    from minipd.engine.scheduler import ScheduledChunk, Scheduler

log = logging.getLogger(__name__)


class KVSink(Protocol):
    def on_layer(self, layer: int, num_final_tokens: int) -> None: ...

    def on_prefilled(self, first_token: int, block_ids: list[int], compute: tuple[float, float]) -> None: ...

    def on_failed(self, reason: str) -> None: ...


LayerCall = tuple[KVSink, int]  # a sink and the prompt tokens final after this step


def sink_calls(chunks: Sequence[ScheduledChunk]) -> list[LayerCall]:
    """The sinks of a step's chunks, each with the prompt tokens whose KV the step makes final."""
    return [
        (c.request.kv_sink, c.request.num_computed_tokens + c.num_new_tokens)
        for c in chunks
        if c.request.kv_sink is not None
    ]


def layer_notifier(
    loop: asyncio.AbstractEventLoop, calls: list[LayerCall], wait_for_device: Callable[[], None] | None
) -> Callable[[int], None]:
    """A model layer hook (runs on the compute thread) that tells the sinks on the loop;
    `wait_for_device` first makes the write visible to other streams (CUDA)."""

    def layer_done(layer: int) -> None:
        if wait_for_device is not None:
            wait_for_device()
        loop.call_soon_threadsafe(_notify, calls, layer)

    return layer_done


def _notify(calls: list[LayerCall], layer: int) -> None:
    for sink, num_final_tokens in calls:
        try:
            sink.on_layer(layer, num_final_tokens)
        except Exception:  # one sink's failure must not stop the others or the engine
            log.exception("KV sink failed on layer %d", layer)


def hand_off(request: Request, scheduler: Scheduler, succeeded: bool, error: str | None) -> None:
    """Finish a sink's request: on success its blocks go to the sink, else they are freed and
    the sink is told why."""
    sink = request.kv_sink
    if succeeded and request.num_output_tokens:
        block_ids = scheduler.finish(request, free_blocks=False)
        sink.on_prefilled(request.output_token_ids[0], block_ids, request.compute_times)
    else:
        scheduler.finish(request)
        sink.on_failed(error or "aborted")
