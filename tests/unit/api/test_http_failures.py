"""The HTTP front over a backend that fails: nothing internal leaks into a response, a failure
mid-stream is reported in band, /health follows the backend's readiness, and two apps in one
process keep separate metrics."""

from __future__ import annotations

import json
from typing import AsyncIterator

import pytest
from http_helpers import OpenStream, http_json, http_text, sample, scrape

from minipd.api.backend import InstanceStats, ServingBackend
from minipd.engine.checked_prompt import CheckedPrompt
from minipd.engine.request import INSTANCE_LOST, RequestOutput
from minipd.models.tokenizers.tokenizer import ByteTokenizer

MODEL = "tiny"
MAX_MODEL_LEN = 512
SECRET = "secret internal detail"
LOST = "decode-0 died: decode-0: connection closed (connection lost)"
COMPLETIONS = "/v1/completions"


class _FailingStream:
    request_id = "failing"

    def __init__(self, outputs: list[RequestOutput]):
        self._outputs = outputs

    def abort(self) -> None:
        pass

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        for output in self._outputs:
            yield output

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        pass


class FailingBackend:
    """Raises from `submit` for prompt "raise"; otherwise streams a token, then an engine failure."""

    model_name = MODEL
    tokenizer = ByteTokenizer()
    max_model_len = MAX_MODEL_LEN
    vocab_size = 0  # not known: the front checks against the tokenizer's

    def __init__(self, is_ready: bool = True):
        self.is_ready = is_ready

    def submit(self, prompt: CheckedPrompt, request_id: str, *, traceparent: str | None = None) -> _FailingStream:
        if prompt.token_ids == self.tokenizer.encode("raise"):
            raise RuntimeError(SECRET)
        lost = prompt.token_ids == self.tokenizer.encode("lost")  # as the router ends it when decode-0 dies
        return _FailingStream(
            [
                RequestOutput(
                    request_id=request_id, token_ids=[65], text="A", num_prompt_tokens=3, num_output_tokens=1
                ),
                RequestOutput(
                    request_id=request_id,
                    token_ids=[],
                    text="",
                    finished=True,
                    finish_reason="abort",
                    error=LOST if lost else f"engine step failed: {SECRET}",
                    error_kind=INSTANCE_LOST if lost else None,
                ),
            ]
        )

    async def ready(self) -> bool:
        return self.is_ready

    def num_waiting(self) -> int:
        return 0

    def instance_stats(self) -> list[InstanceStats]:
        return []

    def on_transfer_failure(self, callback) -> None:
        pass


def test_fake_backend_satisfies_the_protocol():
    assert isinstance(FailingBackend(), ServingBackend)


@pytest.mark.parametrize("body", [{"prompt": "raise"}, {"prompt": "fail"}])
def test_internal_failures_are_500_without_internals(serve, body):
    served = serve(FailingBackend())
    result = http_json("POST", served.url + COMPLETIONS, body)
    assert result.status == 500 and result.body["error"]["type"] == "server_error"
    assert SECRET not in json.dumps(result.body) and "Traceback" not in json.dumps(result.body)
    assert http_json("GET", served.url + "/health").status == 200  # still serving


def test_failure_mid_stream_is_reported_in_band(serve):
    served = serve(FailingBackend())
    stream = OpenStream(served.url, COMPLETIONS, {"prompt": "fail"})
    assert stream.next_event()["choices"][0]["text"] == "A"
    error = stream.next_event()["error"]
    assert error["type"] == "server_error" and SECRET not in error["message"]
    assert stream.response.readline() == b"\n" and stream.response.readline() == b"data: [DONE]\n"
    stream.close()


def test_a_lost_instance_is_named_in_band_mid_stream(serve):
    served = serve(FailingBackend())
    stream = OpenStream(served.url, COMPLETIONS, {"prompt": "lost"})
    assert stream.next_event()["choices"][0]["text"] == "A"
    error = stream.next_event()["error"]
    assert error["type"] == "server_error" and error["code"] == "instance_lost"
    assert LOST in error["message"] and "internal error" not in error["message"]
    stream.close()


def test_a_lost_instance_is_a_502_naming_it(serve):
    result = http_json("POST", serve(FailingBackend()).url + COMPLETIONS, {"prompt": "lost"})
    assert result.status == 502 and result.body["error"]["code"] == "instance_lost"
    assert LOST in result.body["error"]["message"]


def test_health_reflects_backend_readiness(serve):
    assert http_json("GET", serve(FailingBackend(is_ready=True)).url + "/health").status == 200
    not_ready = http_json("GET", serve(FailingBackend(is_ready=False)).url + "/health")
    assert not_ready.status == 503 and "Retry-After" in not_ready.headers


def test_two_apps_in_one_process_keep_separate_metrics(serve):
    first, second = serve(FailingBackend()), serve(FailingBackend())
    http_json("POST", first.url + COMPLETIONS, {"prompt": "fail"})
    assert "minipd_requests_total" in http_text(second.url + "/metrics")
    assert sample(scrape(first.url), "minipd_requests_total", finish_reason="abort") == 1
    assert sample(scrape(second.url), "minipd_requests_total", finish_reason="abort") == 0
