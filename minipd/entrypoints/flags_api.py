"""The flags of the OpenAI-compatible HTTP API, of the local cluster launcher, and of the
prompts answered from the command line. Each entry's `sets` names the config field it fills
(flag_spec.py); the defaults are those configs' own."""

from __future__ import annotations

from minipd.api.app import HttpConfig
from minipd.control.role import Role
from minipd.entrypoints.config_sections import ClusterConfig, DemoConfig
from minipd.entrypoints.flag_spec import CLUSTER, DEMO, DEMOS, HTTP, ROUTING, SERVING, flag
from minipd.entrypoints.supervisor import BACKOFF_FIRST_S, BACKOFF_MAX_S

_HTTP = HttpConfig()
_CLUSTER = ClusterConfig()
_DEMO = DemoConfig()

FLAGS = (
    # ---- the OpenAI-compatible HTTP API
    flag(
        "--port",
        {Role.BOTH},
        HTTP,
        sets="http.port",
        type=int,
        default=None,
        help="serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics on this port instead "
        "of answering --prompt; 0 picks a free port, announced on stdout",
    ),
    flag(
        "--http-port",
        ROUTING,
        HTTP,
        {Role.ROUTER},
        sets="http.port",
        type=int,
        default=None,
        help="the router also serves the OpenAI API and /metrics on this port; 0 picks a free port, announced on "
        "stdout",
    ),
    flag(
        "--http-host",
        ROUTING,
        HTTP,
        {Role.ROUTER},
        sets="http.host",
        default=_HTTP.host,
        help="address the router's HTTP API binds (default: %(default)s)",
    ),
    flag(
        "--served-model-name",
        SERVING,
        HTTP,
        {Role.ROUTER},
        sets="serving.served_model_name",
        default=None,
        help="the model id clients pass as `model` (default: the --model value)",
    ),
    flag(
        "--max-waiting-requests",
        SERVING,
        HTTP,
        {Role.ROUTER},
        sets="http.max_waiting_requests",
        type=int,
        default=_HTTP.max_waiting_requests,
        help="answer 503 with Retry-After while this many requests wait already (default: %(default)s)",
    ),
    flag(
        "--http-header-timeout-s",
        SERVING,
        HTTP,
        {Role.ROUTER},
        sets="http.header_timeout_s",
        type=float,
        default=_HTTP.header_timeout_s,
        help="close a connection whose request headers are not complete within this, or that idles this long "
        "between requests (default: %(default)s)",
    ),
    flag(
        "--http-body-timeout-s",
        SERVING,
        HTTP,
        {Role.ROUTER},
        sets="http.body_timeout_s",
        type=float,
        default=_HTTP.body_timeout_s,
        help="answer 408 to a request whose body has not fully arrived within this (default: %(default)s)",
    ),
    flag(
        "--plan-profile",
        ROUTING,
        HTTP,
        {Role.ROUTER},
        sets="http.plan_profile",
        default=None,
        metavar="FILE",
        help="a latency profile of these instances (python bench.py profile --model MODEL --json FILE): the "
        "dashboard's live prediction simulates the cluster with it, and its Plan view offers it "
        "(docs/observability.md, The dashboard)",
    ),
    # ---- the local cluster launcher
    flag(
        "--port",
        {Role.CLUSTER},
        CLUSTER,
        {Role.ROUTER},
        sets="cluster.port",
        type=int,
        default=_CLUSTER.port,
        help="the router's client port; 0 picks a free one (default: 0)",
    ),
    flag(
        "--num-prefill",
        {Role.CLUSTER},
        CLUSTER,
        sets="cluster.num_prefill",
        type=int,
        default=_CLUSTER.num_prefill,
        help="prefill instances (default: %(default)s)",
    ),
    flag(
        "--num-decode",
        {Role.CLUSTER},
        CLUSTER,
        sets="cluster.num_decode",
        type=int,
        default=_CLUSTER.num_decode,
        help="decode instances (default: %(default)s)",
    ),
    flag(
        "--num-colocated",
        {Role.CLUSTER},
        CLUSTER,
        sets="cluster.num_colocated",
        type=int,
        default=_CLUSTER.num_colocated,
        help="colocated instances (prefill and decode on one engine) behind the router (default: %(default)s)",
    ),
    flag(
        "--max-restarts",
        {Role.CLUSTER},
        CLUSTER,
        sets="cluster.max_restarts",
        type=int,
        default=_CLUSTER.max_restarts,
        help=f"a child (instance or router) that dies is logged and restarted after a backoff ({BACKOFF_FIRST_S} s, "
        f"doubling up to {BACKOFF_MAX_S:.0f} s) and connected to the router again, at most this many times in a "
        "row; one more death stops the cluster and the launcher exits 1 naming the child. A child that served for "
        f"{_CLUSTER.stable_after_s:.0f} s counts from 0 again. With --launcher ray it is also each instance "
        "actor's max_restarts: how many times Ray places it again when its node is lost (default: %(default)s)",
    ),
    flag(
        "--exit-on-child-failure",
        {Role.CLUSTER},
        CLUSTER,
        sets="cluster.exit_on_child_failure",
        action="store_true",
        help="restart no child: the first that dies stops the cluster and the launcher exits 1 naming it",
    ),
    # ---- answering prompts from the command line
    flag(
        "--prompt",
        DEMOS,
        DEMO,
        sets="demo.prompts",
        action="append",
        default=[],
        help="a prompt to answer and print with its latencies; repeat for several (they run batched). Without "
        "any, `both` reads prompts one per line from standard input and `cluster` serves until Ctrl-C",
    ),
    flag(
        "--max-tokens",
        DEMOS,
        DEMO,
        sets="demo.sampling.max_tokens",
        type=int,
        default=_DEMO.sampling.max_tokens,
        help="tokens to generate per prompt (default: %(default)s)",
    ),
    flag(
        "--temperature",
        DEMOS,
        DEMO,
        sets="demo.sampling.temperature",
        type=float,
        default=_DEMO.sampling.temperature,
        help="sampling temperature; 0 is greedy (default: %(default)s)",
    ),
    flag(
        "--top-p",
        DEMOS,
        DEMO,
        sets="demo.sampling.top_p",
        type=float,
        default=_DEMO.sampling.top_p,
        help="nucleus sampling mass in (0, 1] (default: %(default)s)",
    ),
    flag(
        "--top-k",
        DEMOS,
        DEMO,
        sets="demo.sampling.top_k",
        type=int,
        default=_DEMO.sampling.top_k,
        help="keep the k most likely tokens; 0 disables (default: %(default)s)",
    ),
    flag(
        "--seed", DEMOS, DEMO, sets="demo.sampling.seed", type=int, default=None, help="sampling seed (default: random)"
    ),
    flag(
        "--ignore-eos",
        DEMOS,
        DEMO,
        sets="demo.sampling.ignore_eos",
        action="store_true",
        help="keep generating past the end-of-sequence token",
    ),
    flag(
        "--chat",
        DEMOS,
        DEMO,
        sets="demo.chat",
        action="store_true",
        help="send each prompt as a user message through the model's chat template (instruct models such as "
        "smollm2 answer questions that way)",
    ),
)
