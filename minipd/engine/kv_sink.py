"""The engine's hook for requests whose KV leaves the instance (the prefill role).

A request submitted with a sink runs its whole prompt in one step (prefill instances do not
chunk). The engine calls the sink on the event loop:
1. `on_layer(layer)` once per layer, as soon as that layer's K/V for the step is written
   into the pool (posted from the compute thread while later layers still compute);
2. `on_prefilled(first_token, block_ids, compute)` once, after the step, with the sampled
   first token and the step's (start, end) `time.perf_counter()` stamps. From then on the sink
   owns `block_ids` (the engine does not free them) and must give them back with
   `Engine.release_blocks` once the transfer no longer reads them.
If the request is aborted or fails before step 2, `on_failed(reason)` is called instead and the
engine frees the blocks itself.
"""

from __future__ import annotations

from typing import Protocol


class KVSink(Protocol):
    def on_layer(self, layer: int) -> None: ...

    def on_prefilled(self, first_token: int, block_ids: list[int], compute: tuple[float, float]) -> None: ...

    def on_failed(self, reason: str) -> None: ...
