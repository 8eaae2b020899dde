"""Serving throughput: one offline workload through minipd's engine and through HF `generate`.

The workload: `num_requests` requests with prompt and output lengths drawn uniformly from
the given ranges (fixed seed), prompts of random token ids, greedy, EOS ignored, so every
request produces exactly its output length on both sides.

- engine: every request submitted at once to minipd's engine, which batches them
  continuously (prefill chunks next to running decodes, a finished request's slot refilled
  at once). Tokens/s = the requests' output tokens / wall time from submission to the last
  token.
- hf static: `transformers`' `generate` over the same requests in order, in static batches
  of `hf_batch` (prompts left-padded, the batch runs until its longest output is done, as
  users batch `generate`), on the same weights and dtype and the same compute thread.
  Tokens/s counts only the tokens each request asked for; what a batch generates past a
  request's length is waste, which is the point.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import NamedTuple

import torch

from minipd.engine.engine import Engine
from minipd.engine.model_loader import load_model
from minipd.engine.sampling_params import SamplingParams
from minipd.ops.workload.lengths import LengthDist


class ServingRequest(NamedTuple):
    prompt: list[int]
    output_len: int


def make_requests(
    num_requests: int, prompt_len: LengthDist, output_len: LengthDist, vocab_size: int, seed: int
) -> list[ServingRequest]:
    rng = random.Random(seed)
    return [
        ServingRequest([rng.randrange(vocab_size) for _ in range(prompt_len.sample(rng))], output_len.sample(rng))
        for _ in range(num_requests)
    ]


class Throughput(NamedTuple):
    """Output tokens per second of wall time, and per second of this process's CPU time (all
    its threads): on a machine that other jobs share, the second says what the work cost."""

    tok_s: float
    cpu_tok_s: float


async def engine_tok_s(engine: Engine, requests: list[ServingRequest]) -> Throughput:
    async def one(request: ServingRequest) -> int:
        params = SamplingParams(max_tokens=request.output_len, temperature=0.0, ignore_eos=True)
        produced = 0
        async for out in engine.generate(request.prompt, params):
            produced += len(out.token_ids)
        return produced

    start, cpu_start = time.perf_counter(), time.process_time()
    produced = await asyncio.gather(*(one(r) for r in requests))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if list(produced) != [r.output_len for r in requests]:
        raise RuntimeError("the engine produced other output lengths than asked")
    return Throughput(sum(produced) / elapsed, sum(produced) / cpu)


def dense_state(engine: Engine) -> dict[str, torch.Tensor]:
    """The engine's weights under `transformers`' Llama names: as loaded when the engine serves
    them dense, else the same file loaded again dequantized (a 4-bit engine's quantized layers
    and block embedding hold other tensors; `transformers` itself dequantizes a GGUF)."""
    if engine.model.weights_format == "dense":
        return engine.model.state_dict()
    dense, _ = load_model(engine.config.model, engine.device, engine.dtype, weights="dense")
    return dense.state_dict()


def hf_model(engine: Engine):
    """`transformers`' LlamaForCausalLM holding the engine's weights in its dtype (dequantized
    where the engine serves them quantized: `dense_state`)."""
    import transformers

    c = engine.model_config
    hf_config = transformers.LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=c.bos_token_id,
        eos_token_id=list(c.eos_token_ids),
        pad_token_id=0,
    )
    if c.rope_scaling is not None:
        raise ValueError("the HF comparison builds a plain Llama config: models with rope_scaling are not supported")
    model = transformers.LlamaForCausalLM(hf_config).eval()
    state = dense_state(engine)
    if c.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.to(device=engine.device, dtype=engine.dtype)


def hf_static_tok_s(model, requests: list[ServingRequest], batch: int, pad_id: int = 0) -> Throughput:
    """Runs on the engine's compute thread (one OpenMP team for both)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    useful = 0
    for i in range(0, len(requests), batch):
        group = requests[i : i + batch]
        width = max(len(r.prompt) for r in group)
        ids = torch.tensor([[pad_id] * (width - len(r.prompt)) + r.prompt for r in group], device=model.device)
        mask = torch.tensor([[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in group], device=model.device)
        new_tokens = max(r.output_len for r in group)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
            )
        if out.shape[1] != width + new_tokens:
            raise RuntimeError("generate stopped early")
        useful += sum(r.output_len for r in group)
    return Throughput(useful / (time.perf_counter() - start), useful / (time.process_time() - cpu_start))
