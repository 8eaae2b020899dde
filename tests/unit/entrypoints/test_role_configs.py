"""From a flag to the config field it sets: every flag's `sets` names a real field, the flag's
default is that field's default, and `role_configs` turns a parsed command line into the
typed configs each role runs with (validated, each bad value naming its flag)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from minipd.control.role import Role
from minipd.entrypoints.config_sections import SECTIONS
from minipd.entrypoints.configs import RoleConfigs, flag_values, role_configs
from minipd.entrypoints.flag_fields import SWITCHES, field_default
from minipd.entrypoints.flags import FLAGS, build_parser, inherited_argv
from minipd.transports.backends import backend_options

# a None default that means "off" where the config's own default is the value once on
OFF_BY_NONE = {("--control-port", "instance.port"), ("--port", "http.port"), ("--http-port", "http.port")}


def test_every_flag_sets_a_field_of_the_role_configs():
    assert set(SECTIONS) <= set(RoleConfigs.__dataclass_fields__)
    for flag in FLAGS:
        assert flag.sets, f"{flag.name} sets nothing"
        for path in flag.sets:
            if path not in SWITCHES:
                field_default(path)  # AttributeError naming the path if there is no such field


def test_every_flag_defaults_to_the_default_of_the_field_it_sets(monkeypatch):
    monkeypatch.delenv("MINIPD_CLUSTER_SECRET", raising=False)
    monkeypatch.delenv("MINIPD_API_KEY", raising=False)
    checked = 0
    for flag in FLAGS:
        for path in flag.sets:
            if path in SWITCHES or path == "ratio_controller.policy.slo" or (flag.name, path) in OFF_BY_NONE:
                continue
            default = flag.options.get("default", flag.options.get("action") == "store_false")
            assert default == field_default(path), f"{flag.name} -> {path}"
            checked += 1
    assert checked > 60


def _configs(role: Role, *argv: str) -> RoleConfigs:
    return role_configs(role, build_parser(role).parse_args(["--role", role.value, *argv]))


def test_values_are_nested_by_their_paths():
    args = build_parser(Role.DECODE).parse_args(["--role", "decode", "--max-num-seqs", "7", "--block-size", "8"])
    values = flag_values(Role.DECODE, args)
    assert values["engine"]["scheduler"]["max_num_seqs"] == 7 and values["engine"]["block_size"] == 8
    assert "endpoints" not in values, "the router's flags are not the decode instance's"


def test_an_instance_gets_its_engine_transport_and_instance_configs():
    configs = _configs(
        Role.PREFILL, "--max-num-seqs", "7", "--num-blocks", "64", "--link-gbps", "2", "--instance-id", "p0",
        "--step-log-dir", "/tmp/steps", "--host", "0.0.0.0", "--max-connections", "9",
    )  # fmt: skip
    assert configs.engine.scheduler.max_num_seqs == 7 and configs.engine.num_blocks == 64
    assert configs.engine.step_log == "/tmp/steps/p0.jsonl"
    assert configs.instance.port == 0 and configs.router is None and configs.http is None
    assert configs.transport.options(configs.process) == {
        "link_gbps": 2.0,
        "stall_timeout_s": configs.process.liveness_timeout_s,
        "host": "0.0.0.0",
        "max_connections": 9,
    }


def test_transport_options_come_from_the_backends_spec():
    settings = {"link_gbps": None, "stall_timeout_s": 3.0, "host": "h", "max_connections": 4, "other": 1}
    assert backend_options("tcp", settings) == {"stall_timeout_s": 3.0, "host": "h", "max_connections": 4}
    assert backend_options("ucx", settings) == {"stall_timeout_s": 3.0}
    no_liveness = _configs(Role.DECODE, "--transport", "ucx", "--liveness-timeout-s", "0")
    assert no_liveness.transport.options(no_liveness.process) == {}
    with pytest.raises(ValueError, match="unknown transport"):
        backend_options("pigeon", settings)


def test_the_colocated_api_binds_the_process_host():
    served = _configs(Role.BOTH, "--port", "0", "--host", "0.0.0.0", "--max-waiting-requests", "3")
    assert served.http.host == "0.0.0.0" and served.http.port == 0 and served.http.max_waiting_requests == 3
    assert served.instance.port is None, "no control plane without --control-port"
    demo = _configs(Role.BOTH, "--prompt", "hi", "--max-tokens", "5", "--chat")
    assert demo.http is None and demo.demo.prompts == ["hi"] and demo.demo.chat
    assert demo.demo.sampling.max_tokens == 5 and demo.demo.sampling.temperature == 0.0


def test_the_router_gets_its_policy_endpoints_api_and_controller():
    configs = _configs(
        Role.ROUTER, "--prefill", "h:1", "--decode", "h:2", "--kv-wait-s", "4", "--liveness-timeout-s", "7",
        "--http-port", "0", "--http-host", "0.0.0.0", "--ratio-controller", "--controller-target", "0.8",
        "--controller-interval-s", "2",
    )  # fmt: skip
    assert configs.engine is None and configs.router.kv_wait_s == 4.0 and configs.router.liveness_timeout_s == 7.0
    assert configs.process.liveness_timeout_s == 7.0
    assert configs.endpoints.by_role()[:2] == [(Role.PREFILL, [("h", 1)]), (Role.DECODE, [("h", 2)])]
    assert configs.http.host == "0.0.0.0"
    assert configs.ratio_controller.policy.target == 0.8 and configs.ratio_controller.options.interval_s == 2.0
    assert _configs(Role.ROUTER).ratio_controller is None and _configs(Role.ROUTER).http is None


def test_allowed_hosts_reach_every_http_front_and_the_launchers_router():
    served = _configs(Role.BOTH, "--port", "0", "--allowed-hosts", " a.example, .corp.example,[::2] ")
    assert served.http.allowed_hosts == ("a.example", ".corp.example", "[::2]")
    router = _configs(Role.ROUTER, "--http-port", "0", "--allowed-hosts", "*")
    assert router.http.allowed_hosts == ("*",) and _configs(Role.ROUTER, "--http-port", "0").http.allowed_hosts == ()
    launcher = _configs(Role.CLUSTER, "--allowed-hosts", "a.example,.corp.example")
    argv = inherited_argv(launcher.parsed, Role.CLUSTER, Role.ROUTER)
    assert argv[argv.index("--allowed-hosts") + 1] == "a.example,.corp.example"  # as typed
    passed = _configs(Role.ROUTER, "--http-port", "0", *argv)
    assert passed.http.allowed_hosts == ("a.example", ".corp.example")
    assert "--allowed-hosts" not in inherited_argv(_configs(Role.CLUSTER).parsed, Role.CLUSTER, Role.ROUTER)


@pytest.mark.parametrize("entry", ["http://a.example", "a.example:8000", "a.example/x", "*.example"])
def test_an_allowed_host_that_is_no_host_name_exits_2_naming_the_flag(entry, capsys):
    with pytest.raises(SystemExit) as exited:
        _configs(Role.ROUTER, "--allowed-hosts", f"b.example,{entry}")
    assert exited.value.code == 2
    assert f"argument --allowed-hosts: {entry!r} is not a host name or address" in capsys.readouterr().err


@pytest.mark.parametrize(
    "role, argv, named",
    [
        (Role.DECODE, ["--max-num-seqs", "0"], "max_num_seqs"),
        (Role.ROUTER, ["--kv-wait-s", "0"], "kv_wait_s"),
        (Role.ROUTER, ["--ratio-controller", "--controller-slo", "ttft:1000"], "controller slo"),
        (Role.ROUTER, ["--ratio-controller", "--controller-slo", "nonsense"], "controller_slo"),
        (Role.ROUTER, ["--http-port", "0", "--http-body-timeout-s", "0"], "body_timeout_s"),
        (Role.CLUSTER, ["--num-decode", "0"], "num_decode"),
        (Role.CLUSTER, ["--transport", "loopback"], "transport"),
        (Role.BOTH, ["--max-tokens", "0"], "max_tokens"),
        (Role.PREFILL, ["--cluster-secret", "short"], "cluster_secret"),
    ],
)
def test_a_bad_value_names_its_flag(role, argv, named):
    with pytest.raises(ValueError, match=named):
        _configs(role, *argv)


def test_the_launcher_keeps_the_engine_config_it_checks():
    configs = _configs(Role.CLUSTER, "--max-model-len", "256", "--torch-threads", "2", "--step-log-dir", "/tmp/s")
    assert configs.engine.scheduler.max_model_len == 256 and configs.engine.torch_threads == 2
    assert configs.engine.step_log is None, "each child names its own step log"
    assert configs.router is not None and configs.cluster.num_decode == 1


def test_the_cluster_launcher_does_not_import_the_role_runners():
    source = Path(__file__).resolve().parents[3] / "minipd" / "entrypoints" / "process_cluster.py"
    imported = {node.module for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, ast.ImportFrom)}
    assert "minipd.entrypoints.process_cluster" not in imported and "minipd.entrypoints.roles" not in imported
