"""The load client and runner against small fake OpenAI servers (aiohttp, in this process):
timing, strict parsing, failures recorded rather than raised, warm-up calibration."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from contracts.strict_openai import strict_completion_chunk
from minipd.ops.loadgen.client import send_completion, typed_chunk
from minipd.ops.loadgen.prompts import ByteTokens, PromptBuilder
from minipd.ops.loadgen.records import RequestRecord
from minipd.ops.loadgen.runner import RunnerConfig, WarmupFailed, run_workload
from minipd.ops.workload import ArrivalProcess, LengthDist, make_workload

MODEL = "fake"
TOKEN_GAP_S = 0.005  # the fake server's pace: real time between events, what the client must measure
BOS = 1  # the fake server counts one special token per prompt, as minipd's presets do


def chunk(text: str | None, finish: str | None = None, usage: dict | None = None, with_object: bool = True) -> dict:
    body = {
        "id": "cmpl-1",
        "created": 1,
        "model": MODEL,
        "choices": [] if text is None else [{"index": 0, "text": text, "finish_reason": finish}],
    }
    if with_object:
        body["object"] = "text_completion"
    if usage is not None:
        body["usage"] = usage
    return body


def fake_app(with_object: bool = True, status: int = 200) -> web.Application:
    """Streams `max_tokens` one-character events `TOKEN_GAP_S` apart, then the usage."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if status != 200:
            return web.json_response(
                {"error": {"message": "overloaded", "type": "x", "param": None, "code": None}}, status=status
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        n = body["max_tokens"]
        for i in range(n):
            await asyncio.sleep(TOKEN_GAP_S)  # the fake model's decode step
            event = chunk("x", "length" if i == n - 1 else None, with_object=with_object)
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        usage = {
            "prompt_tokens": len(body["prompt"].encode()) + BOS,
            "completion_tokens": n,
            "total_tokens": len(body["prompt"].encode()) + BOS + n,
        }
        await response.write(b"data: " + json.dumps(chunk(None, usage=usage)).encode() + b"\n\ndata: [DONE]\n\n")
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    return app


async def serving(app: web.Application):
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def run_against(app: web.Application, coroutine_factory):
    async def main():
        runner, url = await serving(app)
        try:
            return await coroutine_factory(url)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def one_request(app: web.Application, output_len: int = 5, parse_chunk=strict_completion_chunk) -> RequestRecord:
    import aiohttp

    async def go(url: str) -> RequestRecord:
        record = RequestRecord(index=0, scheduled_s=0.0, sent_s=0.0, url=url, prompt_len=4, output_len=output_len)
        async with aiohttp.ClientSession() as session:
            return await send_completion(session, record, MODEL, "abc", timeout_s=10, parse_chunk=parse_chunk)

    return run_against(app, go)


def test_a_stream_is_timed_per_event_and_counted_by_usage():
    record = one_request(fake_app(), output_len=5)
    assert record.success and record.error is None
    assert record.output_tokens == 5 and record.prompt_tokens == 3 + BOS and record.usage_reported
    assert len(record.itl_s) == 4 and all(gap >= TOKEN_GAP_S * 0.8 for gap in record.itl_s)
    assert record.ttft_s >= TOKEN_GAP_S * 0.8
    assert record.e2el_s == pytest.approx(record.ttft_s + sum(record.itl_s))


def test_a_server_whose_chunks_lack_object_fails_every_request():
    record = one_request(fake_app(with_object=False))
    assert not record.success and "refused" in record.error and "object" in record.error


def test_the_default_parser_reads_a_chunk_without_object_but_refuses_one_without_choices():
    """minipd's own load (no openai package) reads the fields it needs, typed."""
    assert one_request(fake_app(with_object=False), parse_chunk=typed_chunk).success
    record = one_request(fake_app(with_object=False), parse_chunk=lambda raw: typed_chunk({**raw, "choices": 7}))
    assert not record.success and "refused" in record.error and "choices" in record.error


def test_an_error_status_is_recorded_not_raised():
    record = one_request(fake_app(status=503))
    assert not record.success and record.error == "HTTP 503: overloaded"


def test_the_runner_warms_up_calibrates_and_paces_arrivals():
    specs = make_workload(
        "prefill-heavy",
        6,
        ArrivalProcess.poisson(50.0),
        seed=2,
        prompt_len=LengthDist.uniform(20, 40),
        output_len=LengthDist.fixed(3),
    )
    builder = PromptBuilder(ByteTokens(), seed=0)
    result = run_against(
        fake_app(), lambda url: run_workload([url], specs, builder, "t", RunnerConfig(num_warmup=1, progress=False))
    )
    assert result.special_tokens == BOS and result.num_prompt_len_mismatches == 0
    assert [r.prompt_tokens for r in result.records] == [s.prompt_len for s in specs]
    assert all(r.success and r.output_tokens == 3 for r in result.records)
    for record, spec in zip(result.records, specs):
        assert record.sent_s >= spec.arrival_s - 1e-3  # never sent before its arrival
    assert result.duration_s >= specs[-1].arrival_s


def test_a_failing_warm_up_stops_the_run():
    specs = make_workload(
        "prefill-heavy", 2, ArrivalProcess.poisson(10.0), prompt_len=LengthDist.fixed(8), output_len=LengthDist.fixed(2)
    )
    with pytest.raises(WarmupFailed, match="503"):
        run_against(
            fake_app(status=503),
            lambda url: run_workload(
                [url], specs, PromptBuilder(ByteTokens(), seed=0), "t", RunnerConfig(progress=False)
            ),
        )
