"""The cluster launcher and the secrets: its children share one generated cluster secret and
the router child the API key, both through their environment and never on their command
lines; every listener binds 127.0.0.1; the cluster serves with them, and a client without the
secret is refused. Plus the start-up checks and warnings of the command line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from disagg_helpers import ENGINE_ARGV, ROUTER_ARGV
from http_helpers import REQUEST_TIMEOUT_S
from socket_queues import listening_addresses

from minipd.control.handshake import AuthenticationError
from minipd.control.role import Role
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.configs import role_configs
from minipd.entrypoints.credentials import warn_if_exposed, warn_if_open_api
from minipd.entrypoints.flags import build_parser, inherited_argv, inherited_env
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.router.cluster_client import ClusterClient
from minipd.transports.shared_secret import SharedSecret

API_KEY = "sk-cluster-test-key"
START_TIMEOUT_S = 180.0
TIMEOUT_S = 30.0


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")


def _http_url(cluster: ProcessCluster) -> str:
    line = next(a for a in cluster.child("router").announcements if "serving the OpenAI API" in a)
    return line.rsplit(" on ", 1)[1].strip()


def _post(url: str, authorization: str | None) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": authorization} if authorization else {})}
    request = urllib.request.Request(
        f"{url}/v1/completions",
        method="POST",
        headers=headers,
        data=b'{"prompt": "Hello there, minipd", "max_tokens": 3}',
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.timeout(300)
def test_children_share_a_generated_secret_through_their_environment_and_the_cluster_serves(loop_thread, monkeypatch):
    monkeypatch.delenv("MINIPD_CLUSTER_SECRET", raising=False)
    monkeypatch.delenv("MINIPD_API_KEY", raising=False)
    cluster = ProcessCluster.from_argv(
        ["--transport", "tcp", "--http-port", "0", "--api-key", API_KEY, *ENGINE_ARGV, *ROUTER_ARGV]
    )
    loop_thread.run(cluster.start(), timeout=START_TIMEOUT_S)

    async def serve():
        client = await cluster.client()
        try:
            outputs = [o async for o in client.generate(list(range(60)), SamplingParams(max_tokens=4))]
        finally:
            await client.close()
        refused = []
        for secret in (None, SharedSecret(b"not the generated secret at all")):
            with pytest.raises(AuthenticationError) as info:
                await ClusterClient.connect(*cluster.router_address, TIMEOUT_S, secret=secret)
            refused.append(str(info.value))
        return outputs[-1], refused

    try:
        pids = {c.name: c.process.pid for c in cluster.children}
        environments = {name: _environ(pid) for name, pid in pids.items()}
        command_lines = {name: _cmdline(pid) for name, pid in pids.items()}
        listening = {name: listening_addresses(pid) for name, pid in pids.items()}
        last, refused = loop_thread.run(serve(), timeout=TIMEOUT_S * 2)
        url = _http_url(cluster)
        statuses = [_post(url, None), _post(url, "Bearer wrong"), _post(url, f"Bearer {API_KEY}")]
    finally:
        loop_thread.run(cluster.stop())
    secrets = {env.get("MINIPD_CLUSTER_SECRET") for env in environments.values()}
    assert len(secrets) == 1 and None not in secrets, "every child must get the same secret"
    generated = secrets.pop()
    assert len(generated) >= 32 and cluster.args.cluster_secret == generated
    assert environments["router"].get("MINIPD_API_KEY") == API_KEY
    assert all("MINIPD_API_KEY" not in env for name, env in environments.items() if name != "router")
    for name, line in command_lines.items():
        assert generated not in line and API_KEY not in line, f"a secret shows in the command line of {name}"
    for name, addresses in listening.items():
        assert addresses and {host for host, _ in addresses} == {"127.0.0.1"}, (name, addresses)
    assert {len(listening[n]) for n in ("prefill-0", "decode-0")} == {2}, "control and KV ports"
    assert len(listening["router"]) == 2, "client port and HTTP"
    assert last.error is None and last.num_output_tokens == 4 and last.transfer is not None
    assert "requires the cluster secret" in refused[0] and "differ" in refused[1]
    assert statuses == [401, 401, 200]


def test_a_given_secret_is_passed_on_as_given():
    args = build_parser(Role.CLUSTER).parse_args(["--role", "cluster", "--cluster-secret", "x" * 20, "--api-key", "k"])
    assert inherited_env(args, Role.CLUSTER, Role.DECODE) == {"MINIPD_CLUSTER_SECRET": "x" * 20}
    assert inherited_env(args, Role.CLUSTER, Role.ROUTER) == {"MINIPD_CLUSTER_SECRET": "x" * 20, "MINIPD_API_KEY": "k"}
    for child in (Role.DECODE, Role.ROUTER):
        argv = inherited_argv(args, Role.CLUSTER, child)
        assert "x" * 20 not in argv and "k" not in argv and "--max-connections" in argv
    cluster = ProcessCluster(role_configs(Role.CLUSTER, args))
    assert cluster.cluster_secret.proof(b"l") == SharedSecret(b"x" * 20).proof(b"l")


def test_secrets_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("MINIPD_CLUSTER_SECRET", "y" * 24)
    monkeypatch.setenv("MINIPD_API_KEY", "")  # empty counts as unset
    args = build_parser(Role.ROUTER).parse_args(["--role", "router"])
    assert args.cluster_secret == "y" * 24 and args.api_key is None
    assert "y" * 24 not in build_parser(Role.ROUTER).format_help(), "--help must not print the secret"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--role", "decode", "--cluster-secret", "short"], "cluster_secret: the cluster secret must be at least 16"),
        (["--role", "router", "--http-port", "0", "--api-key", " "], "api_key: must not be empty"),
    ],
)
def test_bad_secrets_exit_2_naming_the_flag(argv, words):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIPD_")}
    proc = subprocess.run([sys.executable, "-m", "minipd", *argv], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr


def test_listening_beyond_this_host_without_a_secret_or_key_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="minipd.entrypoints.credentials"):
        warn_if_exposed("the router", "0.0.0.0", None)
        warn_if_open_api("::", None)
        quiet = len(caplog.records)
        warn_if_exposed("the router", "127.0.0.1", None)
        warn_if_exposed("the router", "localhost", None)
        warn_if_exposed("the router", "0.0.0.0", SharedSecret(b"z" * 16))
        warn_if_open_api("0.0.0.0", "key")
        warn_if_open_api("::1", None)
    assert quiet == 2 and len(caplog.records) == 2
    assert "without a cluster secret" in caplog.records[0].message
    assert "without an API key" in caplog.records[1].message
