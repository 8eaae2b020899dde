"""The flags of the OpenAI-compatible HTTP API, of the local cluster launcher, and of the
prompts answered from the command line. Each entry names the config field it fills (`sets`),
whose default and type it takes (flag_fields.py)."""

from __future__ import annotations

from minipd.control.role import Role
from minipd.entrypoints.config_sections import ClusterConfig
from minipd.entrypoints.flag_fields import flag_group
from minipd.entrypoints.flag_spec import CLUSTER, DEMO, DEMOS, HTTP, ROUTING, SERVING
from minipd.entrypoints.supervisor import BACKOFF_FIRST_S, BACKOFF_MAX_S

_http = flag_group(SERVING, HTTP, {Role.ROUTER})
_cluster = flag_group({Role.CLUSTER}, CLUSTER)
_demo = flag_group(DEMOS, DEMO)

FLAGS = (
    # ---- the OpenAI-compatible HTTP API
    _http(
        "--port",
        roles={Role.BOTH},
        inherit=(),
        sets="http.port",
        default=None,  # no HTTP front: the prompts are answered from the command line
        help="serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics on this port instead "
        "of answering --prompt; 0 picks a free port, announced on stdout",
    ),
    _http(
        "--http-port",
        roles=ROUTING,
        sets="http.port",
        default=None,  # no HTTP front: the router serves only its client port
        help="the router also serves the OpenAI API and /metrics on this port; 0 picks a free port, announced on "
        "stdout",
    ),
    _http(
        "--http-host",
        roles=ROUTING,
        sets="http.host",
        help="address the router's HTTP API binds (default: %(default)s)",
    ),
    _http(
        "--served-model-name",
        sets="serving.served_model_name",
        help="the model id clients pass as `model` (default: the --model value)",
    ),
    _http(
        "--max-waiting-requests",
        sets="http.max_waiting_requests",
        help="answer 503 with Retry-After while this many requests wait already (default: %(default)s)",
    ),
    _http(
        "--http-header-timeout-s",
        sets="http.header_timeout_s",
        help="close a connection whose request headers are not complete within this, or that idles this long "
        "between requests (default: %(default)s)",
    ),
    _http(
        "--http-body-timeout-s",
        sets="http.body_timeout_s",
        help="answer 408 to a request whose body has not fully arrived within this (default: %(default)s)",
    ),
    _http(
        "--plan-profile",
        roles=ROUTING,
        sets="http.plan_profile",
        metavar="FILE",
        help="a latency profile of these instances (python bench.py profile --model MODEL --json FILE): the "
        "dashboard's live prediction simulates the cluster with it, and its Plan view offers it "
        "(docs/observability.md, The dashboard)",
    ),
    # ---- the local cluster launcher
    _cluster(
        "--port",
        inherit={Role.ROUTER},
        sets="cluster.port",
        help="the router's client port; 0 picks a free one (default: 0)",
    ),
    _cluster("--num-prefill", sets="cluster.num_prefill", help="prefill instances (default: %(default)s)"),
    _cluster("--num-decode", sets="cluster.num_decode", help="decode instances (default: %(default)s)"),
    _cluster(
        "--num-colocated",
        sets="cluster.num_colocated",
        help="colocated instances (prefill and decode on one engine) behind the router (default: %(default)s)",
    ),
    _cluster(
        "--max-restarts",
        sets="cluster.max_restarts",
        help=f"a child (instance or router) that dies is logged and restarted after a backoff ({BACKOFF_FIRST_S} s, "
        f"doubling up to {BACKOFF_MAX_S:.0f} s) and connected to the router again, at most this many times in a "
        "row; one more death stops the cluster and the launcher exits 1 naming the child. A child that served for "
        f"{ClusterConfig().stable_after_s:.0f} s counts from 0 again. With --launcher ray it is also each instance "
        "actor's max_restarts: how many times Ray places it again when its node is lost (default: %(default)s)",
    ),
    _cluster(
        "--exit-on-child-failure",
        sets="cluster.exit_on_child_failure",
        action="store_true",
        help="restart no child: the first that dies stops the cluster and the launcher exits 1 naming it",
    ),
    # ---- answering prompts from the command line
    _demo(
        "--prompt",
        sets="demo.prompts",
        action="append",
        help="a prompt to answer and print with its latencies; repeat for several (they run batched). Without "
        "any, `both` reads prompts one per line from standard input and `cluster` serves until Ctrl-C",
    ),
    _demo("--max-tokens", sets="demo.sampling.max_tokens", help="tokens to generate per prompt (default: %(default)s)"),
    _demo(
        "--temperature",
        sets="demo.sampling.temperature",
        help="sampling temperature; 0 is greedy (default: %(default)s)",
    ),
    _demo("--top-p", sets="demo.sampling.top_p", help="nucleus sampling mass in (0, 1] (default: %(default)s)"),
    _demo(
        "--top-k", sets="demo.sampling.top_k", help="keep the k most likely tokens; 0 disables (default: %(default)s)"
    ),
    _demo("--seed", sets="demo.sampling.seed", help="sampling seed (default: random)"),
    _demo(
        "--ignore-eos",
        sets="demo.sampling.ignore_eos",
        action="store_true",
        help="keep generating past the end-of-sequence token",
    ),
    _demo(
        "--chat",
        sets="demo.chat",
        action="store_true",
        help="send each prompt as a user message through the model's chat template (instruct models such as "
        "smollm2 answer questions that way)",
    ),
)
