"""The parts of a role's configuration that belong to no subsystem's own config: the process,
the instance, its KV transport, what the API serves, the router's instances, the local
cluster, the command-line demo, and the ratio controller's pair of configs; and `SECTIONS`,
every section a flag fills by name, to its default config.

Each is a frozen struct whose defaults are the flags' defaults (`flag_fields.flag` reads each
flag's default and type from its field through `SECTIONS`, the engine's, router's and HTTP
front's included); `configs.py` fills them from a parsed command line. A `validate` method
names the flag in its ValueError.
"""

from __future__ import annotations

from typing import Any, Callable

import msgspec

from minipd.api.app import DEFAULT_HOST, SHUTDOWN_TIMEOUT_S, HttpConfig
from minipd.control.channel import DEFAULT_LIVENESS_TIMEOUT_S
from minipd.control.limits import DEFAULT_MAX_CONNECTIONS
from minipd.control.role import Role
from minipd.disagg.instance import DEFAULT_LEASE_S
from minipd.engine.config import EngineConfig
from minipd.engine.kv_admission import DEFAULT_KV_ADMISSION_RATIO
from minipd.engine.sampling_params import SamplingParams
from minipd.ops.control_loop.live_controller import LiveControllerOptions
from minipd.ops.registry.etcd_url import RegistryTls, RegistryUrl, check_login
from minipd.policy.pool_scaling import PoolBounds, ScalingConfig
from minipd.policy.ratio_controller import ControllerConfig
from minipd.router.router_config import RouterConfig
from minipd.slo.targets import SLO
from minipd.transports.backends import backend_options

Address = tuple[str, int]
DEFAULT_REGISTRY_TTL_S = 5


class ProcessConfig(msgspec.Struct, frozen=True, kw_only=True):
    log_level: str = "WARNING"
    host: str = DEFAULT_HOST  # every port of the process binds here
    shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S
    liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S  # 0: no heartbeats
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # per listener
    cluster_secret: str | None = None  # as given; `credentials.parse_cluster_secret` checks it
    cpus: tuple[int, ...] | None = None  # the cores it is pinned to; None: not pinned
    registry: RegistryUrl | None = None  # None: the embedded default (registration over the control port)
    registry_ttl_s: int = DEFAULT_REGISTRY_TTL_S  # of its registry lease
    registry_tls: RegistryTls = RegistryTls()  # as given; `with_registry_tls` puts it in `registry`
    otlp_traces_endpoint: str | None = None  # where spans go (minipd/tracing); None: not traced

    def __repr__(self) -> str:  # never print the secret
        return f"ProcessConfig(host={self.host!r}, cluster_secret={'<set>' if self.cluster_secret else None})"

    def with_registry_tls(self) -> "ProcessConfig":
        """This config with the TLS flags in `registry`, checked with the login (ValueError
        naming the flag: TLS without --registry, a certificate without its key, a file that
        cannot be read, a user without the password in the environment)."""
        if self.registry is None:
            if self.registry_tls.enabled:
                raise ValueError("registry_ca: --registry-ca, --registry-cert and --registry-key need --registry")
            return self
        self.registry_tls.validate()
        check_login(self.registry)
        return msgspec.structs.replace(self, registry=msgspec.structs.replace(self.registry, tls=self.registry_tls))


class InstanceConfig(msgspec.Struct, frozen=True, kw_only=True):
    port: int | None = 0  # the control port (0: any free one); None: a colocated server without one
    instance_id: str | None = None  # None: ROLE-PID
    start_epoch: int = 0  # the role epoch it starts at (a launcher's restart: above the predecessor's)
    router: Address | None = None  # register there once serving
    lease_s: float = DEFAULT_LEASE_S  # of a decode instance's reservations
    step_log_dir: str | None = None  # the engine's step log goes to DIR/INSTANCE-ID.jsonl
    # the shared KV tier's URL (kvtier/open_tier.py); the launcher's "mooncake": a master of its own
    kv_tier: str | None = None
    kv_tier_fetch: str = "auto"  # fetch or recompute: "auto" (kvtier/fetch_cost.py) or "always"

    def name(self, role: Role, pid: int) -> str:
        return self.instance_id or f"{role.value}-{pid}"


class TransportConfig(msgspec.Struct, frozen=True, kw_only=True):
    name: str = "tcp"  # a key of transports.registry.BACKENDS
    link_gbps: float | None = None  # egress cap; None or 0: none

    def options(self, process: ProcessConfig) -> dict[str, Any]:
        """The backend's options: the process settings its spec says it takes (registry.py)."""
        return backend_options(
            self.name,
            {
                "link_gbps": self.link_gbps or None,
                # a KV send stuck this long fails like a dead peer; 0 turns liveness off
                "stall_timeout_s": process.liveness_timeout_s if process.liveness_timeout_s > 0 else None,
                "host": process.host,
                "max_connections": process.max_connections,
            },
        )


class ServingConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What an OpenAI API front serves, and how much it admits."""

    model: str = EngineConfig().model
    served_model_name: str | None = None  # None: the model as given
    kv_admission_ratio: float = DEFAULT_KV_ADMISSION_RATIO

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


class RouterEndpoints(msgspec.Struct, frozen=True, kw_only=True):
    """Where the router listens and the instances it starts with."""

    port: int = 8100
    prefill: list[Address] = msgspec.field(default_factory=list)
    decode: list[Address] = msgspec.field(default_factory=list)
    colocated: list[Address] = msgspec.field(default_factory=list)

    def by_role(self) -> list[tuple[Role, list[Address]]]:
        return [(Role.PREFILL, self.prefill), (Role.DECODE, self.decode), (Role.BOTH, self.colocated)]


class ClusterConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The processes `minipd --role cluster` starts."""

    port: int = 0  # the router's client port
    num_prefill: int = 1
    num_decode: int = 1
    num_colocated: int = 0
    max_restarts: int = 5  # of one child in a row; then the launcher gives up and exits 1
    exit_on_child_failure: bool = False  # the first child that dies ends the launcher
    stable_after_s: float = 60.0  # a child that served this long counts its restarts from 0 again
    launcher: str = "local"  # "ray": the instances are placed by Ray (ray_cluster.py)
    ray_address: str | None = None  # None: a local Ray started for the run
    ray_prefill_resources: tuple[tuple[str, float], ...] = ()  # custom Ray resources per role: (name, amount)
    ray_decode_resources: tuple[tuple[str, float], ...] = ()
    # pool scaling (--launcher ray): None where not given; see `scaling`
    min_prefill: int | None = None
    max_prefill: int | None = None
    min_decode: int | None = None
    max_decode: int | None = None
    scale_idle_window_s: float | None = None
    scale_cooldown_s: float | None = None

    def scaling(self) -> ScalingConfig | None:
        """How the pools may scale, or None when no scaling flag was given (the pools keep their
        sizes). A bound not given is the pool's start size. ValueError naming the flag's field:
        scaling without the Ray launcher, a bound out of order, a start size outside its bounds,
        or no decode instance left at the minimum."""
        given = [f for f in _SCALING_FIELDS if getattr(self, f) is not None]
        if not given:
            return None
        if self.launcher != "ray":
            raise ValueError(
                f"{given[0]}: pool scaling needs --launcher ray (the local launcher cannot place new "
                "instances; its pools keep their start sizes)"
            )
        start = {"prefill": self.num_prefill, "decode": self.num_decode}
        limits = {}
        for role, size in start.items():
            low, high = getattr(self, f"min_{role}"), getattr(self, f"max_{role}")
            limits[f"min_{role}"] = min(size, high if high is not None else size) if low is None else low
            limits[f"max_{role}"] = max(size, limits[f"min_{role}"]) if high is None else high
        bounds = PoolBounds(**limits)  # checks min <= max and >= 0
        for role, size in start.items():
            if size < limits[f"min_{role}"]:
                raise ValueError(f"min_{role}: {limits[f'min_{role}']} is above --num-{role} {size}")
            if size > limits[f"max_{role}"]:
                raise ValueError(f"max_{role}: {limits[f'max_{role}']} is below --num-{role} {size}")
        if bounds.min_decode < 1 and self.num_colocated == 0:
            raise ValueError("min_decode: must be >= 1 without colocated instances (someone must decode)")
        defaults = ScalingConfig()
        return ScalingConfig(
            bounds=bounds,
            idle_window_s=defaults.idle_window_s if self.scale_idle_window_s is None else self.scale_idle_window_s,
            cooldown_s=defaults.cooldown_s if self.scale_cooldown_s is None else self.scale_cooldown_s,
        )

    def validate(self, transport: str) -> None:
        for field in ("num_prefill", "num_decode", "num_colocated", "max_restarts"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field}: must be >= 0")
        if self.num_decode + self.num_colocated < 1:
            raise ValueError("num_decode: a cluster needs at least one decode or colocated instance")
        if self.ray_address is not None and self.launcher != "ray":
            raise ValueError("ray_address: needs --launcher ray")
        if transport == "loopback":
            raise ValueError("transport: loopback works only inside one process; choose tcp, ucx or nixl")
        self.scaling()


_SCALING_FIELDS = ("min_prefill", "max_prefill", "min_decode", "max_decode", "scale_idle_window_s", "scale_cooldown_s")


class DemoConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Prompts answered from the command line (`--prompt`), and how."""

    prompts: list[str] = msgspec.field(default_factory=list)
    sampling: SamplingParams = msgspec.field(default_factory=lambda: SamplingParams(max_tokens=32, temperature=0.0))
    chat: bool = False  # through the model's chat template

    def validate(self) -> None:
        self.sampling.validate(vocab_size=2**31)  # token-id fields are checked against the model later


class RatioController(msgspec.Struct, frozen=True, kw_only=True):
    """The live P:D ratio controller's policy and its loop's options."""

    policy: ControllerConfig
    options: LiveControllerOptions = LiveControllerOptions()


DEFAULT_CONTROLLER_SLO = ["ttft:1000", "itl:100"]  # as typed on the command line


def _default_ratio_controller() -> RatioController:
    # ControllerConfig has no default SLO; the flags' default objectives stand in for it
    return RatioController(policy=ControllerConfig(slo=SLO.parse(DEFAULT_CONTROLLER_SLO)))


# the sections of configs.RoleConfigs that flags fill, by name (the first part of a flag's
# `sets` path), each to its default config: the flags' defaults and the configs' starting point
SECTIONS: dict[str, Callable[[], Any]] = {
    "process": ProcessConfig,
    "engine": EngineConfig,
    "router": RouterConfig,
    "http": HttpConfig,
    "serving": ServingConfig,
    "instance": InstanceConfig,
    "transport": TransportConfig,
    "endpoints": RouterEndpoints,
    "cluster": ClusterConfig,
    "demo": DemoConfig,
    "ratio_controller": _default_ratio_controller,
}
