"""Bad input to the Python API and the CLI: a clear error naming the field, and the engine keeps serving."""

from __future__ import annotations

import subprocess
import sys

import pytest
from engine_helpers import complete, greedy

from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams

MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(model="tiny", num_blocks=64, max_model_len=MAX_MODEL_LEN)


@pytest.mark.parametrize(
    "prompt, params, field",
    [
        ("", None, "prompt"),
        ([], None, "prompt_token_ids"),
        ("x" * MAX_MODEL_LEN, None, "prompt"),
        ([1, 2, 100000], None, "prompt_token_ids"),
        ([1, -1], None, "prompt_token_ids"),
        ("hi", SamplingParams(max_tokens=0), "max_tokens"),
        ("hi", SamplingParams(max_tokens=-3), "max_tokens"),
        ("hi", SamplingParams(temperature=-0.5), "temperature"),
        ("hi", SamplingParams(top_p=0.0), "top_p"),
        ("hi", SamplingParams(top_p=1.5), "top_p"),
        ("hi", SamplingParams(top_k=-1), "top_k"),
        ("hi", SamplingParams(stop_token_ids=(999999,)), "stop_token_ids"),
        ("hi", SamplingParams(stop=("",)), "stop"),
    ],
)
def test_bad_request_names_the_field_and_engine_keeps_serving(engine, loop_thread, prompt, params, field):
    with pytest.raises(InvalidRequestError) as info:
        engine.submit(prompt, params)
    assert info.value.field == field and field in str(info.value)
    ok = loop_thread.run(complete(engine, "still serving", greedy(3)))
    assert len(ok.token_ids) == 3


def test_generate_raises_on_first_iteration(engine, loop_thread):
    async def consume():
        async for _ in engine.generate("", greedy(3)):
            pass

    with pytest.raises(InvalidRequestError, match="prompt"):
        loop_thread.run(consume())


def test_abort_midway_frees_blocks(engine, loop_thread):
    async def abort_after_first_token():
        stream = engine.submit("abort me " * 5, greedy(100))
        first = await stream.__anext__()
        assert engine.abort(stream.request_id)
        rest = [o async for o in stream]
        return first, rest

    first, rest = loop_thread.run(abort_after_first_token())
    assert not first.finished and rest[-1].finish_reason == "abort"
    assert not engine.abort("no-such-request")


def test_leaving_the_stream_early_aborts(engine, loop_thread):
    async def leave_early():
        async for out in engine.generate("leave early", greedy(100)):
            return out

    assert loop_thread.run(leave_early()).finished is False
    # the autouse fixture asserts the pool is back to full


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"model": "no-such-preset"}, "model"),
        ({"model": "/nonexistent/dir"}, "model"),
        ({"block_size": 0}, "block_size"),
        ({"num_blocks": 2, "max_model_len": 1024}, "num_blocks"),
        ({"dtype": "int3"}, "dtype"),
    ],
)
def test_bad_engine_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        Engine(EngineConfig.of(**overrides))


@pytest.mark.parametrize(
    "args, field",
    [
        (["--model", "no-such-preset"], "model"),
        (["--model", "/nonexistent/dir"], "model"),
        (["--max-tokens", "0"], "max_tokens"),
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "2"], "top_p"),
    ],
)
def test_cli_bad_input_exits_with_a_clear_error(args, field):
    proc = subprocess.run(
        [sys.executable, "-m", "minipd", "--role", "both", "--prompt", "hi", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert field in proc.stderr and "Traceback" not in proc.stderr


def test_cli_empty_and_too_long_prompts_are_reported(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "minipd",
            "--role",
            "both",
            "--max-model-len",
            "64",
            "--prompt",
            "",
            "--prompt",
            "y" * 80,
            "--prompt",
            "fine",
            "--max-tokens",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "prompt: must not be empty" in proc.stdout
    assert "max_model_len is 64" in proc.stdout
    assert "output (2 tokens" in proc.stdout  # the good prompt was still answered
