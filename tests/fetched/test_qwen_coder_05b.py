"""Qwen2.5-Coder-0.5B-Instruct from the file `minipd models fetch qwen2.5-coder-0.5b` assembles
(qwen2, its Q5_0/Q8_0/K-quant weights kept in their blocks): `minipd --role both --chat` answers a coding
question with Python code, and the model served disaggregated (router, prefill and decode
processes, KV over TCP) equals the same model served colocated, token for token, greedy.

Both sides run float32 and one torch thread, and each prompt is sent alone and fits one prefill
chunk, so both compute the same rows the same way (docs/models.md). Skipped, saying how to
fetch it, where the file is not in the model cache.
"""

from __future__ import annotations

import re
import subprocess
import sys

import msgspec
import pytest
from disagg_helpers import LOCAL_PREFILL_MAX_TOKENS
from engine_helpers import Completion, complete_all, greedy
from fetched_models import requires_fetched

from minipd.api.chat_template import ChatTemplate
from minipd.api.protocol import ChatMessage
from minipd.engine.engine import EngineConfig
from minipd.entrypoints.process_cluster import ProcessCluster

MODEL = "qwen2.5-coder-0.5b"
pytestmark = [requires_fetched(MODEL), pytest.mark.timeout(900)]

QUESTION = "Write a Python function that reverses a string."
ANSWER_MAX_TOKENS = 48
RUN_TIMEOUT_S = 600
START_TIMEOUT_S = 300
MAX_TOKENS = 8
CONFIG = EngineConfig.of(
    model=MODEL,
    dtype="float32",
    block_size=16,
    num_blocks=64,
    max_model_len=512,
    max_num_batched_tokens=256,
    torch_threads=1,
)


def test_role_both_answers_a_coding_question_with_python():
    argv = [sys.executable, "-m", "minipd", "--role", "both", "--model", MODEL, "--chat", "--prompt", QUESTION]
    argv += ["--max-tokens", str(ANSWER_MAX_TOKENS), "--temperature", "0"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model {MODEL} loaded" in proc.stderr
    answer = re.search(r"^  output \((\d+) tokens, finish=(\w+)\): (.*)$", proc.stdout, flags=re.M)
    assert answer, proc.stdout
    text = answer.group(3)
    assert int(answer.group(1)) > 10
    assert "```python" in text and re.search(r"def \w*reverse\w*\(", text), text


def _argv() -> list[str]:
    scheduler = CONFIG.scheduler
    return [
        *("--transport", "tcp", "--model", MODEL, "--dtype", CONFIG.dtype, "--torch-threads", "1"),
        *("--block-size", str(CONFIG.block_size), "--num-blocks", str(CONFIG.num_blocks)),
        *("--max-model-len", str(scheduler.max_model_len)),
        *("--max-num-batched-tokens", str(scheduler.max_num_batched_tokens)),
        *("--local-prefill-max-tokens", str(LOCAL_PREFILL_MAX_TOKENS)),
    ]


async def _one_at_a_time(client, prompts, params) -> list[Completion]:
    done = []
    for prompt in prompts:
        done.append(Completion([out async for out in client.generate(prompt, params)]))
    return done


def test_disaggregated_equals_colocated_token_for_token(make_engine, loop_thread):
    colocated = make_engine(**msgspec.structs.asdict(CONFIG))
    chat = ChatTemplate.for_tokenizer(colocated.tokenizer)
    prompts = [
        colocated.tokenizer.encode("def fibonacci(n):"),  # short: prefilled on the decode instance itself
        colocated.tokenizer.encode(chat.render([ChatMessage("user", QUESTION)], add_generation_prompt=True)),
    ]
    assert len(prompts[0]) <= LOCAL_PREFILL_MAX_TOKENS < len(prompts[1]) <= CONFIG.scheduler.max_num_batched_tokens
    params = greedy(MAX_TOKENS)
    expected = [loop_thread.run(complete_all(colocated, [p], params), timeout=RUN_TIMEOUT_S)[0] for p in prompts]
    processes = ProcessCluster.from_argv(_argv())
    loop_thread.run(processes.start(), timeout=START_TIMEOUT_S)
    client = loop_thread.run(processes.client())
    try:
        actual = loop_thread.run(_one_at_a_time(client, prompts, params), timeout=RUN_TIMEOUT_S)
        for stats in loop_thread.run(client.stats(settle=True)):
            assert stats.num_used_blocks == 0 and stats.num_reservations == 0, stats
    finally:
        loop_thread.run(client.close())
        loop_thread.run(processes.stop())
    for e, a in zip(expected, actual):
        assert a.outputs[-1].error is None, a.outputs[-1].error
        assert len(e.token_ids) == MAX_TOKENS and a.token_ids == e.token_ids
    assert actual[0].outputs[-1].transfer is None, "the short prompt is prefilled on the decode instance"
    transfer = actual[1].outputs[-1].transfer
    assert transfer is not None and transfer.prefill_instance == "prefill-0", "the chat prompt crossed the wire"
