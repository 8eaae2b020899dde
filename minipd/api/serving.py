"""The generation endpoints: /v1/completions and /v1/chat/completions.

One request, top-down:
1. refuse a body that is not `application/json` (415), read it within `body_timeout_s` (408
   past it; 400 for a body that does not decode as its Content-Encoding says), decode it into
   its Struct on a tokenizer thread (400 naming the field on any mismatch) and refuse options
   minipd cannot honour, or a model it does not serve (404);
2. admission: 503 with Retry-After while `max_waiting_requests` requests wait already;
3. render the chat template and tokenize on a tokenizer thread, off the event loop, so a huge
   prompt does not stall other users' streams, and validate prompt and sampling parameters,
   once (400 for a prompt that is empty or too long, or a bad parameter);
4. submit the checked prompt to the backend (400 for a request it refuses, 503 with Retry-After
   when it is unavailable or its KV capacity is claimed already);
5. answer with one JSON body, or with server-sent events ending in `data: [DONE]`.

Leaving step 5 early for any reason, a client disconnect included, leaves the stream's
`async with` block, which aborts the request in the backend and frees its blocks.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Callable, TypeVar

import msgspec
from aiohttp import HttpVersion11, web

from minipd.api.backend import OutputStream, ServingBackend
from minipd.api.chat_template import ChatTemplate
from minipd.api.errors import OVERLOADED, SERVER_ERROR, ApiError, bad_request, from_decode_error
from minipd.api.json_only import require_json
from minipd.api.metrics import (
    OVERLOAD_KV_CAPACITY,
    OVERLOAD_UNAVAILABLE,
    OVERLOAD_WAITING_LIMIT,
    ServingMetrics,
)
from minipd.api.protocol import ChatCompletionRequest, CompletionRequest, GenerationRequest
from minipd.api.request_metrics import RequestRecorder
from minipd.api.responses import Usage, make_usage
from minipd.api.stream_format import ChatFormat, CompletionFormat
from minipd.engine.checked_prompt import CheckedPrompt, check_prompt
from minipd.engine.kv_admission import NoCapacity
from minipd.engine.prompt_encoder import PromptEncoder
from minipd.engine.request import INSTANCE_LOST, RequestOutput
from minipd.engine.request import OVERLOADED as OVERLOADED_KIND
from minipd.engine.sampling_params import InvalidRequestError
from minipd.engine.unavailable import BackendUnavailableError
from minipd.tracing import exporter

log = logging.getLogger(__name__)

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
SSE_DONE = b"data: [DONE]\n\n"
PROMPT_FIELDS = ("prompt", "prompt_token_ids")  # what the engine calls the prompt in its errors
NO_LENGTH_LIMIT = 2**63  # a backend that knows no max_model_len yet (no instance) checks it itself
# Parameters (`; charset=utf-8`) are allowed. A browser sends a cross-origin POST without
# asking first only for text/plain and form types: requiring JSON closes that door.

RequestT = TypeVar("RequestT", bound=GenerationRequest)


def _usage(output: RequestOutput) -> Usage:
    return make_usage(output.num_prompt_tokens, output.num_output_tokens, output.num_cached_tokens)


def _engine_failure(request_id: str) -> ApiError:
    return ApiError(500, f"internal error while generating request {request_id}; see the server log", type=SERVER_ERROR)


class OpenAIServing:
    """The generation handlers of one app, over one backend."""

    def __init__(
        self,
        backend: ServingBackend,
        metrics: ServingMetrics,
        max_waiting_requests: int | None,
        overload_retry_after_s: int,
        body_timeout_s: float,
    ):
        self.backend = backend
        self.metrics = metrics
        self.max_waiting_requests = max_waiting_requests
        self.overload_retry_after_s = overload_retry_after_s
        self.body_timeout_s = body_timeout_s
        self.chat_template = ChatTemplate.for_tokenizer(backend.tokenizer)
        self.prompt_encoder = PromptEncoder(backend.tokenizer)
        self._encoder = msgspec.json.Encoder()

    def close(self) -> None:
        self.prompt_encoder.close()

    async def completions(self, http_request: web.Request) -> web.StreamResponse:
        recorder = RequestRecorder(self.metrics)
        request = await self._decode(http_request, CompletionRequest)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        text = request.prompt
        prompt = (lambda: text) if isinstance(text, str) else text
        return await self._generate(
            http_request, request, prompt, "prompt", CompletionFormat(request_id, self.backend.model_name), recorder
        )

    async def chat_completions(self, http_request: web.Request) -> web.StreamResponse:
        recorder = RequestRecorder(self.metrics)
        request = await self._decode(http_request, ChatCompletionRequest)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        messages = request.messages
        return await self._generate(
            http_request,
            request,
            lambda: self.chat_template.render(messages),
            "messages",
            ChatFormat(request_id, self.backend.model_name),
            recorder,
        )

    # ---- steps ----------------------------------------------------------------------
    async def _decode(self, http_request: web.Request, request_type: type[RequestT]) -> RequestT:
        require_json(http_request)
        body = await self._read_body(http_request)
        try:  # on a tokenizer thread too: a few megabytes of JSON take milliseconds to decode
            request = await self.prompt_encoder.run(lambda: msgspec.json.decode(body, type=request_type))
        except msgspec.DecodeError as exc:
            raise from_decode_error(exc) from None
        request.check_supported()
        if request.model is not None and request.model != self.backend.model_name:
            raise ApiError(
                404,
                f"model: {request.model!r} is not served here; this server serves {self.backend.model_name!r}",
                param="model",
                code="model_not_found",
            )
        return request

    async def _read_body(self, http_request: web.Request) -> bytes:
        """The whole (decompressed) body; aiohttp answers 413 past client_max_size."""
        try:
            return await asyncio.wait_for(http_request.read(), self.body_timeout_s)
        except asyncio.TimeoutError:
            http_request.content.feed_eof()  # the rest is never read: the connection closes after the answer
            raise ApiError(
                408, f"the request body did not arrive within {self.body_timeout_s:g} s", close_connection=True
            ) from None
        except web.RequestPayloadError as exc:
            http_request.content.feed_eof()
            encoding = http_request.headers.get("Content-Encoding", "identity")
            raise ApiError(
                400,
                f"Content-Encoding: the request body is not valid {encoding}: {exc.__cause__ or exc}",
                close_connection=True,
            ) from None

    async def _check(
        self, prompt: Callable[[], str] | list[int], request: GenerationRequest, prompt_param: str
    ) -> CheckedPrompt:
        """The request's one validation (engine/checked_prompt.py): the text `prompt()` makes
        (a chat template's rendering) tokenized and checked on a tokenizer thread, token ids
        checked as they are, each with the sampling parameters."""
        backend, tokenizer = self.backend, self.backend.tokenizer
        # a router that has no instance yet knows neither limit: it refuses the request itself
        limits = (backend.vocab_size or tokenizer.vocab_size, backend.max_model_len or NO_LENGTH_LIMIT)
        params = request.sampling_params_for(backend.max_model_len)
        try:
            if isinstance(prompt, list):
                return check_prompt(tokenizer, prompt, params, *limits)
            return await self.prompt_encoder.run(lambda: check_prompt(tokenizer, prompt(), params, *limits))
        except InvalidRequestError as exc:
            raise self._invalid(exc, prompt_param) from None

    @staticmethod
    def _invalid(exc: InvalidRequestError, prompt_param: str) -> ApiError:
        detail = str(exc).removeprefix(f"{exc.field}: ")
        return bad_request(prompt_param if exc.field in PROMPT_FIELDS else exc.field, detail)

    def _admit(self) -> None:
        limit = self.max_waiting_requests
        if limit is None:
            return
        num_waiting = self.backend.num_waiting()
        if num_waiting >= limit:
            self.metrics.record_overload(OVERLOAD_WAITING_LIMIT)
            raise ApiError(
                503,
                f"overloaded: {num_waiting} requests are waiting (limit {limit}); retry later",
                type=OVERLOADED,
                retry_after_s=self.overload_retry_after_s,
            )

    def _submit(
        self, prompt: CheckedPrompt, prompt_param: str, request_id: str, traceparent: str | None
    ) -> OutputStream:
        try:
            return self.backend.submit(prompt, request_id, traceparent=traceparent)
        except InvalidRequestError as exc:
            raise self._invalid(exc, prompt_param) from None
        except BackendUnavailableError as exc:
            self.metrics.record_overload(OVERLOAD_UNAVAILABLE)
            raise ApiError(503, f"unavailable: {exc}", type=OVERLOADED, retry_after_s=exc.retry_after_s) from None
        except NoCapacity as exc:
            self.metrics.record_overload(OVERLOAD_KV_CAPACITY)
            raise ApiError(
                503, f"overloaded: {exc}; retry later", type=OVERLOADED, retry_after_s=self.overload_retry_after_s
            ) from None

    async def _generate(
        self,
        http_request: web.Request,
        request: GenerationRequest,
        prompt: Callable[[], str] | list[int],
        prompt_param: str,
        fmt: CompletionFormat | ChatFormat,
        recorder: RequestRecorder,
    ) -> web.StreamResponse:
        self._admit()
        checked = await self._check(prompt, request, prompt_param)
        # the client's trace context (W3C Trace Context), read only while this process exports traces
        traceparent = http_request.headers.get("traceparent") if exporter.current is not None else None
        stream = self._submit(checked, prompt_param, fmt.request_id, traceparent)
        recorder.submitted(fmt.request_id)
        try:
            async with stream:
                if request.stream:
                    return await self._stream(http_request, stream, fmt, recorder, request, len(checked.token_ids))
                return await self._collect(stream, fmt, recorder)
        except (asyncio.CancelledError, ConnectionError):
            recorder.on_disconnect()
            log.info("client of %s went away; request aborted", fmt.request_id)
            raise
        finally:
            recorder.left()

    def _backend_failure(self, request_id: str, output: RequestOutput) -> ApiError:
        """The answer to a request the backend failed: an overload says so (503, retry later,
        with the backend's reason: the client did nothing wrong and may try again); a lost
        instance is a 502 naming it and what happened (the router's words: an instance id and
        how it was lost, nothing internal); any other failure is an internal error whose
        details stay in the server log."""
        if output.error_kind == OVERLOADED_KIND:
            log.warning("request %s: %s", request_id, output.error)
            self.metrics.record_overload(OVERLOAD_KV_CAPACITY)
            return ApiError(
                503, f"{output.error}; retry later", type=OVERLOADED, retry_after_s=self.overload_retry_after_s
            )
        if output.error_kind == INSTANCE_LOST:
            log.warning("request %s: %s", request_id, output.error)
            return ApiError(
                502, f"request {request_id} failed: {output.error}", type=SERVER_ERROR, code="instance_lost"
            )
        log.error("request %s failed in the backend: %s", request_id, output.error)
        return _engine_failure(request_id)

    async def _collect(
        self, stream: OutputStream, fmt: CompletionFormat | ChatFormat, recorder: RequestRecorder
    ) -> web.Response:
        texts: list[str] = []
        async for output in stream:
            recorder.on_output(output)
            if output.error is not None:
                raise self._backend_failure(fmt.request_id, output)
            texts.append(output.text)
            if output.finished:
                body = fmt.whole("".join(texts), output.finish_reason, _usage(output))
                return web.Response(body=self._encoder.encode(body), content_type="application/json")
        raise _engine_failure(fmt.request_id)  # the stream ended without a finished increment

    async def _stream(
        self,
        http_request: web.Request,
        stream: OutputStream,
        fmt: CompletionFormat | ChatFormat,
        recorder: RequestRecorder,
        request: GenerationRequest,
        num_prompt_tokens: int,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=SSE_HEADERS)
        if http_request.version < HttpVersion11:
            # HTTP/1.0 has no chunked encoding: the stream's end is the connection's end, said
            # outright (aiohttp would keep a keep-alive connection open, the client waiting)
            response.force_close()
            response.headers["Connection"] = "close"
        await response.prepare(http_request)
        opening_usage = make_usage(num_prompt_tokens, 0, 0) if request.continuous_usage else None
        for chunk in fmt.opening(opening_usage):
            await self._send(response, chunk)
        try:
            await self._relay(response, stream, fmt, recorder, request)
        except ConnectionError:
            raise
        except Exception:  # the status line is sent already: report in-band, never with a traceback
            log.exception("request %s failed while streaming", fmt.request_id)
            await self._send(response, _engine_failure(fmt.request_id).body())
        await response.write(SSE_DONE)
        await response.write_eof()
        return response

    async def _relay(
        self,
        response: web.StreamResponse,
        stream: OutputStream,
        fmt: CompletionFormat | ChatFormat,
        recorder: RequestRecorder,
        request: GenerationRequest,
    ) -> None:
        async for output in stream:
            recorder.on_output(output)
            if output.error is not None:
                await self._send(response, self._backend_failure(fmt.request_id, output).body())
                return
            # One event per generated token, even one whose text is held back (an unfinished
            # UTF-8 sequence, a possible stop string): clients time tokens by events, as
            # vLLM's streams let them.
            if output.token_ids or output.text or output.finished:
                usage = _usage(output) if request.continuous_usage else None  # the counts so far
                await self._send(response, fmt.chunk(output.text, output.finish_reason, usage))
            if output.finished and request.include_usage:
                await self._send(response, fmt.usage_chunk(_usage(output)))

    async def _send(self, response: web.StreamResponse, event: msgspec.Struct) -> None:
        await response.write(b"data: " + self._encoder.encode(event) + b"\n\n")
