"""What a try waits on while an instance streams it, made once per stream.

Contract: `StreamWaits.next` returns the try's next message from its one queue of outputs
(a `TokenOutput`, or the `CallError` refusing its stream), or the `KVFailed` that resolved its
KV fate (the one route of a KV failure: router.py resolves it, `TryState.kv_failed`); it raises
ChannelClosed when the instance is lost (declared dead, or its channel closed) first, and
TimeoutError when nothing comes within the timeout. An output already queued is returned
before anything else is looked at, without a future; otherwise the wait adds one future (the
queue's get) to the two made for the whole stream (the instance lost, its channel closed),
which `close` cancels.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from minipd.control.channel import ChannelClosed

if TYPE_CHECKING:
    from minipd.control.messages import CallError, KVFailed, TokenOutput
    from minipd.router.registry import InstanceHandle


class StreamWaits:
    """The waits of one stream from `instance`: its outputs, its try's KV fate (None: no KV
    moved for it), the instance's loss."""

    def __init__(
        self,
        instance: InstanceHandle,
        outputs: asyncio.Queue[TokenOutput | CallError],
        kv_fate: asyncio.Future[KVFailed] | None,
    ):
        self._instance, self._outputs, self._kv_fate = instance, outputs, kv_fate
        self._ends = {
            asyncio.ensure_future(instance.lost.wait()),
            asyncio.ensure_future(instance.channel.closed.wait()),
        }

    async def next(self, timeout: float) -> TokenOutput | CallError | KVFailed:
        """The next output, or the KV's failure; see the module's contract."""
        if not self._outputs.empty():
            return self._outputs.get_nowait()
        if self._kv_fate is not None and self._kv_fate.done():
            return self._kv_fate.result()
        get = asyncio.ensure_future(self._outputs.get())
        waits = {get, *self._ends} if self._kv_fate is None else {get, self._kv_fate, *self._ends}
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            get.cancel()
        if get in done:
            return get.result()
        if self._kv_fate is not None and self._kv_fate in done:
            return self._kv_fate.result()
        instance = self._instance
        if not done:
            raise TimeoutError(f"no output from {instance.instance_id} for {timeout} s (the inter-token timeout)")
        raise ChannelClosed(f"{instance.instance_id} died: {instance.lost_reason or instance.channel.close_reason}")

    def close(self) -> None:
        """Stop watching the instance (the stream ended, or the try gave it up)."""
        for end in self._ends:
            end.cancel()
