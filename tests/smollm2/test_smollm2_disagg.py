"""SmolLM2 served disaggregated (router, prefill and decode processes, KV over TCP) equals the
same model served colocated, token for token: a few prompts of which one is longer than the
prefill instance's token budget (so it is prefilled in several chunks, each chunk's KV
streamed as it is computed), and a 6,000-token prompt within SmolLM2's 8k context.

Both sides run one torch thread, so their kernels split the same work the same way. The
long prompt runs in the dtype SmolLM2 is served in on this machine (`--dtype auto`: bfloat16
with native bf16 matmuls, where a 6,000-token prefill takes about a third of the dense float32
time; float32 with the 4-bit weights elsewhere, where emulated bf16 would take minutes), and
disaggregated must still equal colocated bit for bit, because both run the same chunks through
the same kernels. It
asks for three tokens: the one sampled on the prefill instance, and two decoded from the
6,000 positions of KV that crossed the wire.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from disagg_helpers import LOCAL_PREFILL_MAX_TOKENS
from engine_helpers import Completion, complete_all, greedy
from gguf_helpers import requires_smollm2

from minipd.engine.engine import EngineConfig
from minipd.entrypoints.process_cluster import ProcessCluster

pytestmark = requires_smollm2

BLOCK_SIZE = 16
SHORT = EngineConfig.of(
    model="smollm2",
    dtype="float32",
    block_size=BLOCK_SIZE,
    num_blocks=160,
    max_model_len=1024,
    max_num_batched_tokens=96,
    torch_threads=1,
)
LONG_PROMPT_TOKENS = 6000
LONG = EngineConfig.of(
    model="smollm2",
    dtype="auto",
    block_size=BLOCK_SIZE,
    num_blocks=8192 // BLOCK_SIZE,
    max_model_len=8192,
    max_num_batched_tokens=1024,
    torch_threads=1,
)
SHORT_MAX_TOKENS = 8
LONG_MAX_TOKENS = 3
START_TIMEOUT_S = 240
RUN_TIMEOUT_S = 240

PROMPTS = [
    "The capital of France is",  # short: prefilled on the decode instance itself
    "Answer in one sentence: what is the largest planet of the solar system, and what is it made of?",
    "Write a haiku about the sea. The waves roll in, the gulls cry out, and the",
    (
        "Prefill is compute-bound; decode is bandwidth-bound. A serving engine that splits the two phases "
        "across machines must move the KV cache from one to the other, layer by layer, while the next layer "
        "computes. Explain, step by step, why this hides the transfer time, and when it does not. "
    )
    * 4,
]
PARAGRAPH = (
    "Lighthouses began as fires on hilltops; the fires moved into towers, and engineers learned to "
    "focus their light with mirrors and lenses. Keepers trimmed wicks, wound the clockwork that turned "
    "the lens and wrote the weather into logbooks. Today the lamps switch on by themselves at dusk. "
)


def _argv(config: EngineConfig) -> list[str]:
    return [
        "--transport",
        "tcp",
        "--model",
        config.model,
        "--dtype",
        config.dtype,
        "--block-size",
        str(config.block_size),
        "--num-blocks",
        str(config.num_blocks),
        "--max-model-len",
        str(config.scheduler.max_model_len),
        "--max-num-batched-tokens",
        str(config.scheduler.max_num_batched_tokens),
        "--torch-threads",
        "1",
        "--local-prefill-max-tokens",
        str(LOCAL_PREFILL_MAX_TOKENS),
    ]


def _start(config: EngineConfig, loop_thread):
    processes = ProcessCluster.from_argv(_argv(config))
    loop_thread.run(processes.start(), timeout=START_TIMEOUT_S)
    client = loop_thread.run(processes.client())
    return processes, client


def _stop(processes, client, loop_thread) -> None:
    try:
        for stats in loop_thread.run(client.stats(settle=True)):
            assert stats.num_used_blocks == 0 and stats.num_reservations == 0, stats
    finally:
        loop_thread.run(client.close())
        loop_thread.run(processes.stop())


async def _through_cluster(client, prompts, params) -> list[Completion]:
    async def one(prompt):
        return Completion([out async for out in client.generate(prompt, params)])

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def _block_bytes(engine) -> int:
    pool = engine.kv_pool  # [layers, blocks, 2, block_size, kv_heads, head_dim]
    return pool[:, 0].numel() * pool.element_size()


def _assert_disaggregated_equal(expected, actual, prompts, engine) -> None:
    for e, a, prompt in zip(expected, actual, prompts):
        assert a.outputs[-1].error is None, a.outputs[-1].error
        assert a.token_ids == e.token_ids, f"prompt of {len(prompt)} tokens"
        transfer = a.outputs[-1].transfer
        if len(prompt) <= LOCAL_PREFILL_MAX_TOKENS:
            assert transfer is None, "a short prompt is prefilled on the decode instance"
            continue
        assert transfer is not None and transfer.prefill_instance == "prefill-0", "prefilled on the prefill instance"
        # every block of the prompt crossed the wire (the decode instance had none cached)
        assert transfer.decode_cached_tokens == 0
        assert transfer.num_bytes == -(-len(prompt) // BLOCK_SIZE) * _block_bytes(engine)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smollm2_disaggregated_equals_colocated_with_chunked_prefill(make_engine, loop_thread, dtype):
    """float32 serves the 4-bit weights from their blocks (`--weights auto` where minipd's int8
    kernels run) and decodes through the fused step, all prompts at once, in chunks that differ
    between the colocated engine (its budget shared with the decodes) and the prefill instance;
    a colocated step's decode rows take the fused step apart from its prefill chunk. bfloat16
    serves them "mixed" (`--weights auto`): the prompts prefill through the dense copies and
    decode from the 4-bit weights, one request at a time, so that both sides compute the same
    chunks: in bfloat16 torch's CPU attention rounds a row differently when its keys are split
    otherwise (it blocks them by the context length), so other chunks move the last bits of the
    KV (SmolLM2 dense bf16, the 257-token prompt in chunks of 96 or 93: the last hidden state
    differs by up to 0.09) and may flip a near-tie (docs/models.md)."""
    config = SHORT.replace(dtype=dtype)
    colocated = make_engine(**msgspec.structs.asdict(config))
    assert colocated.config.weights == ("mixed" if dtype == "bfloat16" else "quantized")
    prompts = [colocated.tokenizer.encode(p) for p in PROMPTS]
    assert sum(len(p) <= LOCAL_PREFILL_MAX_TOKENS for p in prompts) == 1
    assert max(map(len, prompts)) > 2 * SHORT.scheduler.max_num_batched_tokens, (
        "one prompt needs several prefill chunks"
    )
    waves = [prompts] if dtype == "float32" else [[p] for p in prompts]
    params = greedy(SHORT_MAX_TOKENS)
    expected = [c for w in waves for c in loop_thread.run(complete_all(colocated, w, params), timeout=RUN_TIMEOUT_S)]
    processes, client = _start(config, loop_thread)
    try:
        actual = [c for w in waves for c in loop_thread.run(_through_cluster(client, w, params), timeout=RUN_TIMEOUT_S)]
    finally:
        _stop(processes, client, loop_thread)
    _assert_disaggregated_equal(expected, actual, prompts, colocated)
    assert all(len(e.token_ids) == SHORT_MAX_TOKENS for e in expected)


@pytest.mark.timeout(600)
def test_smollm2_6000_token_prompt_disaggregated_equals_colocated(make_engine, loop_thread):
    colocated = make_engine(**msgspec.structs.asdict(LONG))
    assert colocated.model_config.max_position_embeddings >= 8192
    ids = colocated.tokenizer.encode(PARAGRAPH * (LONG_PROMPT_TOKENS // 40))
    assert len(ids) >= LONG_PROMPT_TOKENS
    prompt = ids[:LONG_PROMPT_TOKENS]
    expected = loop_thread.run(complete_all(colocated, [prompt], greedy(LONG_MAX_TOKENS)), timeout=RUN_TIMEOUT_S)
    processes, client = _start(LONG, loop_thread)
    try:
        actual = loop_thread.run(_through_cluster(client, [prompt], greedy(LONG_MAX_TOKENS)), timeout=RUN_TIMEOUT_S)
    finally:
        _stop(processes, client, loop_thread)
    _assert_disaggregated_equal(expected, actual, [prompt], colocated)
    assert len(expected[0].token_ids) == LONG_MAX_TOKENS
