"""The spans of one prefill's chunks and KV transfer, under its prefill span (tracing/names.py).

Fed by `LayerwiseKVSender` on the event loop (its sink calls come there): a chunk's span runs
from its first layer's KV written to its last layer's; the transfer's from the first layer
handed to the transport to the request's last write completed, with an event per layer sent
(`layer_sent`: its blocks handed to the transport) and per layer landed (`layer_landed`: the
transport reports that layer's write complete, the bytes with the receiver as far as the
sender can know; the receiver's own landing time of the whole request is the decode span's
`kv_landed` event, and its view of the exposed part the router's `minipd.kv.exposed_s`).
Only the events are added per layer, so tracing adds a few microseconds a layer.
"""

from __future__ import annotations

import asyncio

from minipd.tracing import names
from minipd.tracing.spans import Span


class KVTrace:
    def __init__(self, prefill_span: Span, num_layers: int):
        self.prefill_span, self.num_layers = prefill_span, num_layers
        self._chunk: Span | None = None
        self._transfer: Span | None = None
        self._num_chunks = 0

    def on_layer(self, layer: int, num_final_tokens: int) -> None:
        """Layer `layer` of a chunk is written; the first `num_final_tokens` prompt tokens' KV
        is final once the chunk's last layer is."""
        if layer == 0:
            self._num_chunks += 1
            self._chunk = self.prefill_span.child(
                names.PREFILL_CHUNK, {"minipd.chunk": self._num_chunks, "minipd.chunk.final_tokens": num_final_tokens}
            )
        if layer == self.num_layers - 1 and self._chunk is not None:
            self._chunk.end()
            self._chunk = None

    def layer_sent(self, layer: int, num_blocks: int, write: asyncio.Task) -> None:
        if self._transfer is None:
            self._transfer = self.prefill_span.child(names.KV_TRANSFER)
        transfer = self._transfer
        transfer.event(names.LAYER_SENT, {"minipd.layer": layer, "minipd.blocks": num_blocks})
        write.add_done_callback(lambda done: _landed(transfer, layer, done))

    def sent(self, num_bytes: int, transfer_s: float, exposed_s: float) -> None:
        """Every write completed; the sender's view of the transfer's length and exposed part."""
        self.prefill_span.set({"minipd.chunks": self._num_chunks})
        if self._transfer is not None:
            self._transfer.set(
                {"minipd.kv.bytes": num_bytes, "minipd.kv.transfer_s": transfer_s, "minipd.kv.exposed_s": exposed_s}
            )
            self._transfer.end()

    def failed(self, reason: str) -> None:
        for span in (self._chunk, self._transfer):
            if span is not None:
                span.end(reason)


def _landed(transfer: Span, layer: int, write: asyncio.Task) -> None:
    if transfer.ended:
        return
    failed = write.cancelled() or write.exception() is not None
    transfer.event(names.LAYER_LANDED, {"minipd.layer": layer, "minipd.failed": failed})
