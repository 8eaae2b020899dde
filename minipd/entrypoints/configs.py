"""A parsed `minipd --role ROLE` command line, turned into typed configs in one place.

`role_configs(role, args)` reads each flag of the role's table (flags.py) and puts its value
where the flag's `sets` says (`engine.scheduler.max_num_seqs`: the field `max_num_seqs` of
the engine config's scheduler), starting from each section's default config
(`config_sections.SECTIONS`, whose fields give the flags their defaults); then it builds and
validates the configs the role runs with. A bad value raises ValueError naming the field,
which `cli.py` reports as the flag's error (exit status 2). Nothing is loaded here.

What is not a plain copy of one flag is derived below, each with its reason: the colocated
server's HTTP front binds its `--host`; the step log file is named after the instance; the
HTTP front and the ratio controller exist only when asked for.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from minipd.api.app import HttpConfig
from minipd.control.role import Role
from minipd.engine.config import EngineConfig
from minipd.engine.kv_admission import validate_ratio
from minipd.entrypoints.config_sections import (
    SECTIONS,
    ClusterConfig,
    DemoConfig,
    InstanceConfig,
    ProcessConfig,
    RatioController,
    RouterEndpoints,
    ServingConfig,
    TransportConfig,
)
from minipd.entrypoints.credentials import parse_cluster_secret
from minipd.entrypoints.flag_spec import ENGINE_ROLES, ROUTING
from minipd.entrypoints.flags import FLAGS
from minipd.router.router_config import RouterConfig
from minipd.slo.targets import SLO


@dataclass(frozen=True)
class RoleConfigs:
    """Everything one role runs with. A part the role does not use keeps its defaults."""

    role: Role
    process: ProcessConfig
    engine: EngineConfig | None  # the roles that run an engine, and the launcher (checked for its instances)
    router: RouterConfig | None  # the router, and the launcher (checked for its router)
    http: HttpConfig | None  # None: no OpenAI API front
    serving: ServingConfig
    instance: InstanceConfig
    transport: TransportConfig
    endpoints: RouterEndpoints
    cluster: ClusterConfig
    demo: DemoConfig
    ratio_controller: RatioController | None  # None: the P:D ratio stays as started
    # the controller's flags, on or not: what `POST /admin/controller` turns on (None: a role without them)
    controller_policy: RatioController | None
    # The command line as parsed: only for passing flags on to child processes
    # (flags.inherited_argv), which must see them as the user typed them.
    parsed: argparse.Namespace

    def with_cluster_secret(self, text: str) -> "RoleConfigs":
        """These configs with `text` as the cluster secret, in the parsed flags too (so it
        reaches the children)."""
        parsed = argparse.Namespace(**{**vars(self.parsed), "cluster_secret": text})
        return replace(self, process=msgspec.structs.replace(self.process, cluster_secret=text), parsed=parsed)


def flag_values(role: Role, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The parsed value of each of `role`'s flags, nested by the paths in the flags' `sets`."""
    values: dict[str, dict[str, Any]] = {}
    for flag in FLAGS:
        if role not in flag.roles:
            continue
        for path in flag.sets:
            *sections, field = path.split(".")
            node = values
            for section in sections:
                node = node.setdefault(section, {})
            node[field] = getattr(args, flag.dest)
    return values


def role_configs(role: Role, args: argparse.Namespace) -> RoleConfigs:
    """The typed configs of `role` from its parsed flags, validated (ValueError names the field)."""
    values = flag_values(role, args)
    process = _section("process", values).with_registry_tls()
    parse_cluster_secret(process.cluster_secret)  # checked before anything loads
    instance = _section("instance", values)
    transport = _section("transport", values)
    serving = _section("serving", values)
    cluster = _section("cluster", values)
    if role is Role.CLUSTER:
        cluster.validate(transport.name)
    demo = _section("demo", values)
    demo.validate()
    return RoleConfigs(
        role=role,
        process=process,
        engine=_engine(role, _section("engine", values), instance, cluster) if role in ENGINE_ROLES else None,
        router=_checked(_section("router", values)) if role in ROUTING else None,
        http=_http(role, values.get("http", {}), process, serving),
        serving=serving,
        instance=instance,
        transport=transport,
        endpoints=_section("endpoints", values),
        cluster=cluster,
        demo=demo,
        ratio_controller=_ratio_controller(values.get("ratio_controller", {})),
        controller_policy=_controller_policy(values.get("ratio_controller", {})),
        parsed=args,
    )


def _section(name: str, values: dict[str, dict[str, Any]]) -> Any:
    """The default config of section `name` (config_sections.SECTIONS) with the flags' values in place."""
    return _fill(SECTIONS[name](), values.get(name, {}))


def _fill(config: Any, values: dict[str, Any]) -> Any:
    """`config` with `values` in place of its defaults; a nested dict fills a nested config."""
    changes = {
        name: _fill(getattr(config, name), value) if isinstance(value, dict) else value
        for name, value in values.items()
    }
    return msgspec.structs.replace(config, **changes)


def _checked(config: Any) -> Any:
    config.validate()
    return config


def _engine(role: Role, config: EngineConfig, instance: InstanceConfig, cluster: ClusterConfig) -> EngineConfig:
    if role is Role.CLUSTER:
        # the launcher's --cpus are the cores it divides among its children (cli.py checks them
        # against this process's); each child checks its own share, and names its own step log.
        # On Ray the instances run on the nodes Ray picks: a GPU is theirs to check, not the
        # launcher's (its node may have none)
        device = "cpu" if cluster.launcher == "ray" else config.device
        config.replace(cpus=None, device=device).validate()
        return config
    if instance.step_log_dir:
        step_log = os.path.join(instance.step_log_dir, f"{instance.name(role, os.getpid())}.jsonl")
        config = config.replace(step_log=step_log)
    return _checked(config)


def _http(role: Role, values: dict[str, Any], process: ProcessConfig, serving: ServingConfig) -> HttpConfig | None:
    """The HTTP front's config when its port is given (`--port` of `both`, `--http-port` of a
    router), else None."""
    if values.get("port") is None:
        return None
    if role is Role.BOTH:  # the colocated server has one address for all its ports
        values = {**values, "host": process.host}
    validate_ratio(serving.kv_admission_ratio)
    return _checked(_fill(HttpConfig(), values))


def _ratio_controller(values: dict[str, Any]) -> RatioController | None:
    """The controller's policy and options with --ratio-controller, else None."""
    return _controller_policy(values) if values.get("on") else None


def _controller_policy(values: dict[str, Any]) -> RatioController | None:
    """The controller's policy and options from its flags, on or not; None for a role without
    them. The configs' own checks name the flag."""
    if "policy" not in values:
        return None
    try:
        slo = SLO.parse(values["policy"]["slo"])
    except ValueError as exc:
        raise ValueError(f"controller_slo: {exc}") from None
    policy = {**values["policy"], "slo": slo}
    return _fill(SECTIONS["ratio_controller"](), {"policy": policy, "options": values.get("options", {})})
