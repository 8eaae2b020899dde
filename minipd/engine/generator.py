"""The one shape of `submit` and `generate` that every way of running requests shares.

`Engine` (one instance), `Router` (a cluster, in its own process), `InProcessCluster` (a
whole cluster in this program) and `ClusterClient` (a cluster's router, over its control
port) all satisfy `Generator`:

- `submit(prompt, params=None, request_id=None)` starts the request and returns its
  `RequestStream` at once: iterate it for `RequestOutput` increments until one has
  `finished`; leaving `async with stream` early aborts the request everywhere it lives;
- `generate(prompt, params=None, request_id=None)` is that stream, iterated inside
  `async with`: an async iterator of the same outputs.

`prompt` is text or token ids; `params` None means the defaults; `request_id` None lets the
callee number the request. Each may take keyword-only options of its own (the router's
`layerwise`), which `generate` passes on to `submit`. A request refused before it started
raises from `submit` (from `generate`'s first iteration), except that a `ClusterClient`
learns of the router's refusals over the network: they end its stream as a finished output
whose `error` says why.
"""

from __future__ import annotations

from typing import AsyncIterator, Protocol, Sequence, runtime_checkable

from minipd.engine.request import RequestOutput
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import SamplingParams


@runtime_checkable
class Generator(Protocol):
    def submit(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> RequestStream: ...

    def generate(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]: ...


class GeneratesFromSubmit:
    """`generate` written once, on top of the class's own `submit`."""

    def submit(self, prompt, params=None, request_id=None, **options) -> RequestStream:
        raise NotImplementedError

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        **options,
    ) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs; leaving the loop early aborts the request."""
        async with self.submit(prompt, params, request_id, **options) as stream:
            async for output in stream:
                yield output
