"""Weights served "mixed" (4-bit plus a dense copy): which rows of a step go dense is decided per
request (the prompt rows of a prompt of `DENSE_MIN_ROWS` tokens or more, whatever its chunks),
never by what shares the step, so a step mixing a prefill chunk with decodes computes each as
it would run alone: the same logits bit for bit, and an engine's tokens equal those of each
request served alone."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import torch
from engine_helpers import complete, greedy
from gguf import GGMLQuantizationType
from gguf_helpers import TINY, hf_weights, write_llama_gguf

from minipd.engine.model_runner import ModelRunner
from minipd.engine.request import Request
from minipd.engine.scheduler import ScheduledChunk
from minipd.models.kernels import vnni_kernels
from minipd.models.weights.quantized_linear import DENSE_MIN_ROWS

PROMPT_TOKENS = 40
DECODE_TOKENS = 12


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("mixed-rows") / "tiny.gguf"
    return str(write_llama_gguf(path, TINY, hf_weights(TINY), GGMLQuantizationType.Q4_1))


def _engine(make_engine, q4_model: str, **overrides):
    config = dict(model=q4_model, dtype="bfloat16", weights="mixed", num_blocks=64, max_model_len=128) | overrides
    engine = make_engine(**config)
    assert engine.config.weights == config["weights"]
    return engine


def _prompt(seed: int, n: int = PROMPT_TOKENS) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, TINY.vocab_size) for _ in range(n)]


def _request(engine, name: str, prompt: list[int], outputs: list[int] = ()) -> Request:
    request = Request(name, prompt, greedy(4))
    request.token_ids += outputs
    request.block_ids = engine.block_manager.reserve(engine.block_manager.blocks_for(request.num_tokens + 1))
    return request


def test_dense_rows_are_the_prompt_rows_of_prompts_from_the_crossover_on(make_engine, q4_model):
    engine = _engine(make_engine, q4_model)
    runner = ModelRunner(engine.model, engine.kv_pool)
    assert runner.dense_min_prompt == DENSE_MIN_ROWS < engine.config.block_size
    decode = _request(engine, "decode", _prompt(1, 20), [5])
    decode.num_computed_tokens = decode.num_tokens - 1
    short = _request(engine, "short", _prompt(2, DENSE_MIN_ROWS - 1))
    # the last 3 rows of a long prompt: dense too, whatever the chunk's size (a colocated
    # step's budget, shared with its decodes, chunks a prompt otherwise than a prefill instance)
    tail = _request(engine, "tail", _prompt(3, 30))
    tail.num_computed_tokens = 27
    # preempted and recomputed: its prompt rows go dense, its two output rows stay 4-bit
    recomputed = _request(engine, "recomputed", _prompt(4, 10), [6, 7])
    try:
        chunks = [
            ScheduledChunk(decode, 1, True),
            ScheduledChunk(short, short.num_tokens, True),
            ScheduledChunk(tail, 3, True),
            ScheduledChunk(recomputed, recomputed.num_tokens, True),
        ]
        *_, rows = runner._prepare(chunks)
        first_tail = 1 + (DENSE_MIN_ROWS - 1)
        first_recomputed = first_tail + 3
        assert rows.dense == ((first_tail, first_recomputed), (first_recomputed, first_recomputed + 10))
        assert rows.rest.tolist() == list(range(first_tail)) + [first_recomputed + 10, first_recomputed + 11]
        *_, decode_only = runner._prepare(chunks[:1])
        assert decode_only.dense == ()
    finally:
        for r in (decode, short, tail, recomputed):
            engine.block_manager.free(r.block_ids)


def test_every_prompt_that_fills_a_block_goes_dense(make_engine, q4_model):
    """Blocks smaller than the crossover lower it to a block: a prefix-cached block was then
    always computed dense, as the prompt that finds it computes its own rows."""
    engine = _engine(make_engine, q4_model, block_size=4)
    runner = ModelRunner(engine.model, engine.kv_pool)
    assert runner.dense_min_prompt == 4
    one_block, under = _request(engine, "block", _prompt(5, 4)), _request(engine, "under", _prompt(6, 3))
    try:
        *_, rows = runner._prepare([ScheduledChunk(one_block, 4, True), ScheduledChunk(under, 3, True)])
        assert rows.dense == ((0, 4),) and rows.rest == slice(4, 7)
    finally:
        engine.block_manager.free(one_block.block_ids + under.block_ids)


def test_a_prefill_chunk_beside_decodes_gives_each_its_logits_alone(make_engine, q4_model):
    engine = _engine(make_engine, q4_model)
    runner = ModelRunner(engine.model, engine.kv_pool)
    decodes = [_request(engine, f"d{i}", _prompt(10 + i, 20 + 7 * i), [4]) for i in range(3)]
    prefill = _request(engine, "p", _prompt(20))
    try:
        for r in decodes:  # their prompts' KV first
            engine.run_on_compute_thread(runner.execute, [ScheduledChunk(r, r.num_prompt_tokens, False)])
            r.num_computed_tokens = r.num_prompt_tokens
        decode_chunks = [ScheduledChunk(r, 1, True) for r in decodes]
        prefill_chunk = ScheduledChunk(prefill, prefill.num_tokens, True)

        def logits_of(batch):
            input_ids, positions, meta, logit_rows, rows = runner._prepare(batch)
            index = torch.tensor(logit_rows)
            return engine.model(input_ids, positions, engine.kv_pool, meta, index, runner.buffers, None, rows)

        together = engine.run_on_compute_thread(logits_of, decode_chunks + [prefill_chunk])
        decodes_alone = engine.run_on_compute_thread(logits_of, decode_chunks)
        prefill_alone = engine.run_on_compute_thread(logits_of, [prefill_chunk])
        assert torch.equal(together[:3], decodes_alone)
        assert torch.equal(together[3:], prefill_alone)
    finally:
        for r in decodes + [prefill]:
            engine.block_manager.free(r.block_ids)


def test_a_request_prefilled_beside_running_decodes_gets_the_tokens_it_gets_alone(
    make_engine, loop_thread, q4_model, tmp_path
):
    step_log = tmp_path / "steps.jsonl"
    engine = _engine(make_engine, q4_model, enable_prefix_caching=False, step_log=str(step_log))
    _assert_overlapped_equals_alone(engine, loop_thread, step_log)


@pytest.mark.skipif(vnni_kernels.best() is None, reason="none of minipd's int8 kernels runs on this CPU")
def test_fused_decode_rows_beside_a_prefill_chunk_get_the_tokens_they_get_alone(
    make_engine, loop_thread, q4_model, tmp_path
):
    """float32 serves the blocks and decodes through the fused step: a step that mixes a
    prefill chunk with decode rows runs the chunk eagerly and the rows fused, apart."""
    step_log = tmp_path / "steps.jsonl"
    engine = _engine(
        make_engine, q4_model, dtype="float32", weights="quantized", enable_prefix_caching=False, step_log=str(step_log)
    )
    fused, rows = engine.runner.fused, []
    assert fused is not None

    def counted(input_ids, *args):
        rows.append(input_ids.numel())
        return fused(input_ids, *args)

    engine.runner.fused = counted
    try:
        _assert_overlapped_equals_alone(engine, loop_thread, step_log)
    finally:
        engine.runner.fused = fused
    # two requests alone, then overlapped: every output token but each one's first is a fused row
    assert sum(rows) == 4 * (DECODE_TOKENS - 1)


def _assert_overlapped_equals_alone(engine, loop_thread, step_log) -> None:
    running, arriving = _prompt(30), _prompt(31)

    async def alone(prompt):
        return (await complete(engine, prompt, greedy(DECODE_TOKENS))).token_ids

    async def overlapped():
        stream = engine.generate(running, greedy(DECODE_TOKENS))
        first = await anext(stream)  # `running` decodes from here on
        later = asyncio.ensure_future(alone(arriving))
        rest = [out async for out in stream]
        return first.token_ids + [t for out in rest for t in out.token_ids], await later

    expected = (loop_thread.run(alone(running)), loop_thread.run(alone(arriving)))
    lines_alone = len(step_log.read_text().splitlines())
    assert loop_thread.run(overlapped()) == expected
    steps = [json.loads(line) for line in step_log.read_text().splitlines()[lines_alone:]]
    mixed = [s for s in steps if s["q"] == [PROMPT_TOKENS] and s["ctx"]]
    assert mixed, "the arriving prompt must have been prefilled in a step beside the running decode"


def test_quantized_keeps_every_row_on_the_4_bit_weights(make_engine, q4_model):
    engine = _engine(make_engine, q4_model, weights="quantized")
    assert engine.model.weights_format == "quantized" and engine.model.dense_copy_nbytes == 0
    runner = ModelRunner(engine.model, engine.kv_pool)
    prefill = _request(engine, "p", _prompt(40))
    try:
        input_ids, positions, meta, logit_rows, rows = runner._prepare([ScheduledChunk(prefill, PROMPT_TOKENS, True)])
        assert rows.dense == ((0, PROMPT_TOKENS),)  # asked for, but there is no copy to read

        def logits(split):
            index = torch.tensor(logit_rows)
            return engine.model(input_ids, positions, engine.kv_pool, meta, index, runner.buffers, None, split)

        assert torch.equal(engine.run_on_compute_thread(logits, rows), engine.run_on_compute_thread(logits, None))
    finally:
        engine.block_manager.free(prefill.block_ids)
