"""The router's flags: where it listens and its instances, the routing policy, and the P:D
ratio controller. Each entry names the config field it fills (`sets`), whose default and type
it takes (flag_fields.py)."""

from __future__ import annotations

from minipd.control.role import Role
from minipd.entrypoints.config_sections import DEFAULT_CONTROLLER_SLO
from minipd.entrypoints.flag_fields import flag_group
from minipd.entrypoints.flag_spec import CONTROLLER, POLICY, ROUTER, ROUTING, SERVING, Flag, parse_address
from minipd.router.router_config import KV_LOAD_FAILURE_POLICIES

_router = flag_group({Role.ROUTER}, ROUTER)
_policy = flag_group(ROUTING, POLICY, {Role.ROUTER})
_controller = flag_group(ROUTING, CONTROLLER, {Role.ROUTER})


def _instances(name: str, role: str, help: str) -> Flag:
    """`--prefill`, `--decode`, `--colocated`: the router's instances of one role at start."""
    return _router(name, sets=f"endpoints.{role}", type=parse_address, action="append", metavar="HOST:PORT", help=help)


FLAGS = (
    # ---- the router
    _router(
        "--port",
        sets="endpoints.port",
        help="port for clients (minipd.ClusterClient) and instance registration; 0 picks a free one "
        "(default: %(default)s)",
    ),
    _instances("--prefill", "prefill", "a prefill instance's control port; repeat for several"),
    _instances("--decode", "decode", "a decode instance's control port; repeat for several"),
    _instances(
        "--colocated",
        "colocated",
        "a colocated instance's control port (`--role both --control-port`); repeat for several",
    ),
    _policy(
        "--local-prefill-max-tokens",
        sets="router.local_prefill_max_tokens",
        help="prompts with at most this many uncached tokens are prefilled on the decode instance itself "
        "(conditional disaggregation, Dynamo's isl_bounding); -1 disables (default: %(default)s)",
    ),
    _policy(
        "--prefill-busy-tokens",
        sets="router.prefill_busy_tokens",
        help="also prefill a prompt on its decode instance when the least-loaded prefill instance has more than "
        "this many prompt tokens queued and decode has room (Dynamo's prefill_load; default: off)",
    ),
    _policy(
        "--prefill-busy-requests",
        sets="router.prefill_busy_requests",
        help="the same rule on prompts queued per prefill instance (default: off)",
    ),
    _policy(
        "--decode-room-kv-fraction",
        sets="router.decode_room_kv_fraction",
        help="decode has room for a local prefill while its KV use after admitting the request stays at or "
        "below this fraction (default: %(default)s)",
    ),
    _policy(
        "--decode-room-max-running",
        sets="router.decode_room_max_running",
        help="... and it runs fewer sequences than this (default: its --max-num-seqs)",
    ),
    _policy(
        "--no-layerwise",
        sets="router.layerwise",
        dest="layerwise",
        action="store_false",
        help="send the KV after the whole prefill instead of layer by layer (for comparison)",
    ),
    _policy(
        "--kv-admission-ratio",
        roles=SERVING,
        sets=("router.kv_admission_ratio", "serving.kv_admission_ratio"),
        help="accept a request only while the KV blocks that live requests may fill (prompt + max_tokens each) "
        "stay within this many times the KV blocks of the decode pools (the engine's pool when colocated); "
        "beyond, answer 503 with Retry-After. 1 gives every accepted request room for its whole output; "
        "above 1 overcommits (the excess waits for blocks); 0 disables (default: %(default)s)",
    ),
    _policy(
        "--kv-wait-s",
        sets="router.kv_wait_s",
        help="longest a request waits for room in a decode pool before it fails as overloaded (default: %(default)s)",
    ),
    # ---- the P:D ratio controller (router)
    _controller(
        "--ratio-controller",
        sets="ratio_controller.on",
        action="store_true",
        help="move one instance at a time between prefill and decode, in place, when measured TTFT or ITL "
        "misses --controller-slo over a sliding window (docs/planner.md); with --registry, only on the router "
        "elected among those given this flag",
    ),
    _controller(
        "--controller-slo",
        sets="ratio_controller.policy.slo",
        type=str,  # the words as typed; configs.py parses them into an SLO
        nargs="+",
        default=DEFAULT_CONTROLLER_SLO,
        metavar="KEY:MS",
        help="the objectives the controller keeps: ttft and itl (or tpot), milliseconds (default: %(default)s)",
    ),
    _controller(
        "--controller-target",
        sets="ratio_controller.policy.target",
        help="attainment each side should reach (default: %(default)s)",
    ),
    _controller(
        "--controller-hysteresis",
        sets="ratio_controller.policy.hysteresis",
        help="a side must fall short of the target, and of the other side, by more than this to move an "
        "instance (default: %(default)s)",
    ),
    _controller(
        "--controller-window-s",
        sets="ratio_controller.policy.window_s",
        help="the sliding window latencies are judged over, in seconds (default: %(default)s)",
    ),
    _controller(
        "--controller-cooldown-s",
        sets="ratio_controller.policy.cooldown_s",
        help="at least this long between two moves (default: %(default)s)",
    ),
    _controller(
        "--controller-min-samples",
        sets="ratio_controller.policy.min_samples",
        help="hold while fewer samples than this were taken since the last move (default: %(default)s)",
    ),
    _controller(
        "--controller-interval-s",
        sets="ratio_controller.options.interval_s",
        help="how often the controller decides (default: %(default)s)",
    ),
    _controller(
        "--controller-drain-timeout-s",
        sets="ratio_controller.options.drain_timeout_s",
        help="a moved instance whose requests have not finished by then stays in its role (default: %(default)s)",
    ),
    _policy(
        "--kv-load-failure",
        sets="router.kv_load_failure",
        choices=KV_LOAD_FAILURE_POLICIES,
        help="when a request's KV does not arrive (the transfer failed, or its reservation's lease ran out for "
        "want of prefill progress): recompute (the decode instance prefills the prompt itself) or fail (the "
        "request ends with an error saying why) (default: %(default)s)",
    ),
    _policy(
        "--migration-limit",
        sets="router.migration_limit",
        help="a request whose decode instance is lost (dies, is declared dead, or goes silent past "
        "--inter-token-timeout-s) after some of its tokens were streamed goes on on another instance, "
        "its prompt followed by the tokens so far, up to this many times; 0 ends it with an error naming the "
        "instance (default: %(default)s)",
    ),
    _policy(
        "--inter-token-timeout-s",
        sets="router.inter_token_timeout_s",
        help="a relayed stream that brings no output for this long fails with an error naming the instance "
        "(default: %(default)s)",
    ),
)
