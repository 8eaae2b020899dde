"""The router's flags: where it listens and its instances, the routing policy, and the P:D
ratio controller. Each entry's `sets` names the config field it fills (flag_spec.py); the
defaults are those configs' own."""

from __future__ import annotations

from minipd.control.role import Role
from minipd.entrypoints.config_sections import DEFAULT_CONTROLLER_SLO, RouterEndpoints
from minipd.entrypoints.flag_spec import (
    CONTROLLER,
    POLICY,
    ROUTER,
    ROUTING,
    SERVING,
    flag,
    parse_address,
)
from minipd.ops.control_loop.live_controller import LiveControllerOptions
from minipd.policy.ratio_controller import ControllerConfig
from minipd.router.router_config import KV_LOAD_FAILURE_POLICIES, RouterConfig
from minipd.slo.targets import SLO

_ENDPOINTS = RouterEndpoints()
_ROUTING = RouterConfig()
_POLICY = ControllerConfig(slo=SLO.parse(DEFAULT_CONTROLLER_SLO))
_LIVE = LiveControllerOptions()

FLAGS = (
    # ---- the router
    flag(
        "--port",
        {Role.ROUTER},
        ROUTER,
        sets="endpoints.port",
        type=int,
        default=_ENDPOINTS.port,
        help="port for clients (minipd.ClusterClient) and instance registration; 0 picks a free one "
        "(default: %(default)s)",
    ),
    flag(
        "--prefill",
        {Role.ROUTER},
        ROUTER,
        sets="endpoints.prefill",
        type=parse_address,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a prefill instance's control port; repeat for several",
    ),
    flag(
        "--decode",
        {Role.ROUTER},
        ROUTER,
        sets="endpoints.decode",
        type=parse_address,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a decode instance's control port; repeat for several",
    ),
    flag(
        "--colocated",
        {Role.ROUTER},
        ROUTER,
        sets="endpoints.colocated",
        type=parse_address,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a colocated instance's control port (`--role both --control-port`); repeat for several",
    ),
    flag(
        "--local-prefill-max-tokens",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        sets="router.local_prefill_max_tokens",
        type=int,
        default=_ROUTING.local_prefill_max_tokens,
        help="prompts with at most this many uncached tokens are prefilled on the decode instance itself "
        "(conditional disaggregation, Dynamo's isl_bounding); -1 disables (default: %(default)s)",
    ),
    flag(
        "--prefill-busy-tokens",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        sets="router.prefill_busy_tokens",
        type=int,
        default=_ROUTING.prefill_busy_tokens,
        help="also prefill a prompt on its decode instance when the least-loaded prefill instance has more than "
        "this many prompt tokens queued and decode has room (Dynamo's prefill_load; default: off)",
    ),
    flag(
        "--prefill-busy-requests",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        sets="router.prefill_busy_requests",
        type=int,
        default=_ROUTING.prefill_busy_requests,
        help="the same rule on prompts queued per prefill instance (default: off)",
    ),
    flag(
        "--decode-room-kv-fraction",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        sets="router.decode_room_kv_fraction",
        type=float,
        default=_ROUTING.decode_room_kv_fraction,
        help="decode has room for a local prefill while its KV use after admitting the request stays at or "
        "below this fraction (default: %(default)s)",
    ),
    flag(
        "--decode-room-max-running",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        sets="router.decode_room_max_running",
        type=int,
        default=_ROUTING.decode_room_max_running,
        help="... and it runs fewer sequences than this (default: its --max-num-seqs)",
    ),
    flag(
        "--no-layerwise",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        sets="router.layerwise",
        dest="layerwise",
        action="store_false",
        help="send the KV after the whole prefill instead of layer by layer (for comparison)",
    ),
    flag(
        "--kv-admission-ratio",
        SERVING,
        POLICY,
        {Role.ROUTER},
        sets=("router.kv_admission_ratio", "serving.kv_admission_ratio"),
        type=float,
        default=_ROUTING.kv_admission_ratio,
        help="accept a request only while the KV blocks that live requests may fill (prompt + max_tokens each) "
        "stay within this many times the KV blocks of the decode pools (the engine's pool when colocated); "
        "beyond, answer 503 with Retry-After. 1 gives every accepted request room for its whole output; "
        "above 1 overcommits (the excess waits for blocks); 0 disables (default: %(default)s)",
    ),
    flag(
        "--kv-wait-s",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        sets="router.kv_wait_s",
        type=float,
        default=_ROUTING.kv_wait_s,
        help="longest a request waits for room in a decode pool before it fails as overloaded (default: %(default)s)",
    ),
    # ---- the P:D ratio controller (router)
    flag(
        "--ratio-controller",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        sets="ratio_controller.on",
        action="store_true",
        help="move one instance at a time between prefill and decode, in place, when measured TTFT or ITL "
        "misses --controller-slo over a sliding window (docs/planner.md); with --registry, only on the router "
        "elected among those given this flag",
    ),
    flag(
        "--controller-slo",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        sets="ratio_controller.policy.slo",
        nargs="+",
        default=DEFAULT_CONTROLLER_SLO,
        metavar="KEY:MS",
        help="the objectives the controller keeps: ttft and itl (or tpot), milliseconds (default: %(default)s)",
    ),
    flag(
        "--controller-target",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        sets="ratio_controller.policy.target",
        type=float,
        default=_POLICY.target,
        help="attainment each side should reach (default: %(default)s)",
    ),
    flag(
        "--controller-hysteresis",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        sets="ratio_controller.policy.hysteresis",
        type=float,
        default=_POLICY.hysteresis,
        help="a side must fall short of the target, and of the other side, by more than this to move an "
        "instance (default: %(default)s)",
    ),
    flag(
        "--controller-window-s",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        sets="ratio_controller.policy.window_s",
        type=float,
        default=_POLICY.window_s,
        help="the sliding window latencies are judged over, in seconds (default: %(default)s)",
    ),
    flag(
        "--controller-cooldown-s",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        sets="ratio_controller.policy.cooldown_s",
        type=float,
        default=_POLICY.cooldown_s,
        help="at least this long between two moves (default: %(default)s)",
    ),
    flag(
        "--controller-min-samples",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        sets="ratio_controller.policy.min_samples",
        type=int,
        default=_POLICY.min_samples,
        help="hold while fewer samples than this were taken since the last move (default: %(default)s)",
    ),
    flag(
        "--controller-interval-s",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        sets="ratio_controller.options.interval_s",
        type=float,
        default=_LIVE.interval_s,
        help="how often the controller decides (default: %(default)s)",
    ),
    flag(
        "--controller-drain-timeout-s",
        ROUTING,
        CONTROLLER,
        {Role.ROUTER},
        sets="ratio_controller.options.drain_timeout_s",
        type=float,
        default=_LIVE.drain_timeout_s,
        help="a moved instance whose requests have not finished by then stays in its role (default: %(default)s)",
    ),
    flag(
        "--kv-load-failure",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        sets="router.kv_load_failure",
        default=_ROUTING.kv_load_failure,
        choices=KV_LOAD_FAILURE_POLICIES,
        help="when a request's KV does not arrive (the transfer failed, or its reservation's lease ran out for "
        "want of prefill progress): recompute (the decode instance prefills the prompt itself) or fail (the "
        "request ends with an error saying why) (default: %(default)s)",
    ),
    flag(
        "--migration-limit",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        sets="router.migration_limit",
        type=int,
        default=_ROUTING.migration_limit,
        help="a request whose decode instance is lost (dies, is declared dead, or goes silent past "
        "--inter-token-timeout-s) after some of its tokens were streamed goes on on another instance, "
        "its prompt followed by the tokens so far, up to this many times; 0 ends it with an error naming the "
        "instance (default: %(default)s)",
    ),
    flag(
        "--inter-token-timeout-s",
        ROUTING,
        POLICY,
        {Role.ROUTER},
        sets="router.inter_token_timeout_s",
        type=float,
        default=_ROUTING.inter_token_timeout_s,
        help="a relayed stream that brings no output for this long fails with an error naming the instance "
        "(default: %(default)s)",
    ),
)
