"""engine: decode tokens/s of the engine vs a raw model loop vs transformers' generate.

All three run the same weights (the `small` preset by default) on the same batches: `batch`
prompts of `--prompt-len` random tokens, `--output-len` greedy tokens each (EOS ignored).
Decode throughput counts the tokens after the first one, over the time from the last first
token to the last token, so prefill is left out of all three.

- engine: minipd's asyncio engine through its Python API (scheduling, sampling, streaming);
- raw: a loop calling the model forward on prebuilt inputs with argmax (the overhead floor);
- hf: `transformers` LlamaForCausalLM.generate with its KV cache on the same weights.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import torch

from minipd.engine.dtype_choice import DTYPE_CHOICES
from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.model_runner import ModelRunner
from minipd.engine.request import Request
from minipd.engine.sampling_params import SamplingParams
from minipd.engine.scheduler import ScheduledChunk

from benchmarks.baseline_plots import plot_engine as plot  # noqa: F401 (bench.py --plot)

DEFAULT_BATCHES = (1, 8, 32)
REFERENCE_BATCH = 8  # overhead and speedup are reported at this batch size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small", help="preset or HF directory (default: %(default)s)")
    parser.add_argument("--batches", type=int, nargs="+", default=list(DEFAULT_BATCHES))
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="median of this many runs (default: %(default)s)")
    parser.add_argument("--skip-hf", action="store_true", help="leave out transformers' generate")
    parser.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES,
                        help="engine (and transformers) dtype; the README's figures are float32 (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run: the tiny model, small batches")


QUICK = {"model": "tiny", "batches": [1, 2], "prompt_len": 16, "output_len": 8, "repeats": 1}


def _prompts(batch: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(length)] for _ in range(batch)]


async def _engine_decode_s(engine: Engine, prompts: list[list[int]], output_len: int) -> float:
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    first_token_times: list[float] = []

    async def one(prompt: list[int]) -> None:
        async for out in engine.generate(prompt, params):
            if out.num_output_tokens == len(out.token_ids):  # the increment carrying the first token
                first_token_times.append(time.perf_counter())

    await asyncio.gather(*(one(p) for p in prompts))
    return time.perf_counter() - max(first_token_times)


def _raw_decode_s(engine: Engine, prompts: list[list[int]], output_len: int) -> float:
    """Prefill untimed, then decode with inputs and attention metadata all built before timing."""
    runner = ModelRunner(engine.model, engine.kv_pool)
    bm = engine.block_manager
    requests = []
    for i, prompt in enumerate(prompts):
        request = Request(f"raw-{i}", prompt, SamplingParams(max_tokens=output_len, temperature=0.0))
        request.block_ids = bm.reserve(bm.blocks_for(len(prompt) + output_len))
        requests.append(request)
    try:
        first = runner.execute([ScheduledChunk(r, len(r.token_ids), True) for r in requests])
        steps = []
        for step in range(output_len - 1):
            for r in requests:
                r.num_computed_tokens = len(r.token_ids)
                r.token_ids.append(first[0])  # placeholder id; the loop feeds argmax output instead
            _, positions, meta, _ = runner._prepare([ScheduledChunk(r, 1, True) for r in requests])
            steps.append((positions, meta))
        index = torch.arange(len(requests), device=engine.device)
        next_ids = torch.tensor(first, device=engine.device)
        start = time.perf_counter()
        for positions, meta in steps:
            logits = engine.model(next_ids, positions, engine.kv_pool, meta, index, runner.buffers)
            next_ids = logits.argmax(dim=-1)
        next_ids.tolist()  # wait for the device
        return time.perf_counter() - start
    finally:
        for r in requests:
            bm.free(r.block_ids)


def _hf_model(engine: Engine):
    import transformers

    c = engine.model_config
    hf_config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta, tie_word_embeddings=c.tie_word_embeddings, bos_token_id=c.bos_token_id,
        eos_token_id=list(c.eos_token_ids), pad_token_id=0)
    model = transformers.LlamaForCausalLM(hf_config).eval()
    state = engine.model.state_dict()
    if c.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.to(device=engine.device, dtype=engine.dtype)  # the engine's resolved dtype


def _hf_generate_s(model, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts, device=model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False)
    return time.perf_counter() - start, out[:, ids.shape[1]:].tolist()


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        vars(args).update(QUICK)
    max_len = args.prompt_len + args.output_len + 16
    config = EngineConfig(model=args.model, dtype=args.dtype, num_blocks=max(args.batches) * (max_len // 16 + 1) + 16,
                          max_model_len=max_len, max_num_seqs=max(args.batches), max_num_batched_tokens=2048,
                          enable_prefix_caching=False)
    decode_tokens = args.output_len - 1
    result = {"model": args.model, "dtype": args.dtype, "prompt_len": args.prompt_len, "output_len": args.output_len,
              "torch_threads": torch.get_num_threads(), "engine_tok_s": {}, "raw_tok_s": {}, "hf_tok_s": {}}

    async def measure() -> None:
        async with Engine(config) as engine:
            await _engine_decode_s(engine, _prompts(2, args.prompt_len), 4)  # warm-up
            for b in args.batches:
                prompts = _prompts(b, args.prompt_len)
                engine_s, raw_s = [], []
                for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits both alike
                    engine_s.append(await _engine_decode_s(engine, prompts, args.output_len))
                    # The raw loop runs on the engine's compute thread too: torch work split over two
                    # threads keeps two OpenMP teams alive, which alone slows a forward pass ~2x here.
                    raw_s.append(engine.run_on_compute_thread(_raw_decode_s, engine, prompts, args.output_len))
                result["engine_tok_s"][b] = b * decode_tokens / statistics.median(engine_s)
                result["raw_tok_s"][b] = b * decode_tokens / statistics.median(raw_s)
            if not args.skip_hf:
                result["hf_tok_s"] = engine.run_on_compute_thread(_hf_all, engine, args)

    asyncio.run(measure())
    ref = REFERENCE_BATCH if REFERENCE_BATCH in args.batches else args.batches[0]
    result["reference_batch"] = ref
    result["overhead_vs_raw"] = result["raw_tok_s"][ref] / result["engine_tok_s"][ref]
    if result["hf_tok_s"]:
        result["speedup_vs_hf"] = result["engine_tok_s"][ref] / result["hf_tok_s"][ref]
    return result


def _hf_all(engine: Engine, args: argparse.Namespace) -> dict[int, float]:
    decode_tokens = args.output_len - 1
    hf_model = _hf_model(engine)
    _hf_generate_s(hf_model, _prompts(1, args.prompt_len), 2)  # warm-up
    out = {}
    for b in args.batches:
        prompts = _prompts(b, args.prompt_len)
        full = statistics.median(_hf_generate_s(hf_model, prompts, args.output_len)[0] for _ in range(args.repeats))
        first = statistics.median(_hf_generate_s(hf_model, prompts, 1)[0] for _ in range(args.repeats))
        out[b] = b * decode_tokens / max(full - first, 1e-9)
    return out


def print_table(result: dict) -> None:
    print(f"decode tokens/s, model={result['model']}, prompt {result['prompt_len']}, "
          f"output {result['output_len']}, torch threads {result['torch_threads']}")
    print(f"{'batch':>6} {'engine':>10} {'raw loop':>10} {'hf generate':>12}")
    for b in result["engine_tok_s"]:
        hf = result["hf_tok_s"].get(b)
        print(f"{b:>6} {result['engine_tok_s'][b]:>10.1f} {result['raw_tok_s'][b]:>10.1f} "
              f"{'-' if hf is None else f'{hf:.1f}':>12}")
    ref = result["reference_batch"]
    print(f"overhead_vs_raw (engine time / raw time, batch {ref}): {result['overhead_vs_raw']:.3f}  (target <= 1.15)")
    if "speedup_vs_hf" in result:
        print(f"speedup_vs_hf (batch {ref}): {result['speedup_vs_hf']:.2f}x  (target >= 2.0)")
