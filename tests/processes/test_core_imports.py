"""The serving core runs without the operations around it (docs/architecture.md, "The two rooms").

A plain router (`minipd --role router` with the address of a running decode instance, no
operations flag) serves a chat completion and its dashboard, and has loaded no planner or
simulator, no registry (no etcd client, no minipd.ops.registry module but the `--registry`
flag's URL parser), no Ray and no OpenTelemetry. The dashboard, on by default, works: it plugs
into the HTTP front from the command line, as the admin routes do. The check is the real
process: `python -X importtime` reports every module a process imports on stderr.

And the core on its own: a child process that imports every core module has imported no
module of minipd.ops (tests/unit/test_layers.py checks the import statements; this checks
what they load).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import urllib.request

import pytest
from minipd_process import Process

from minipd.entrypoints.flag_spec import CLUSTER_SECRET_ENV

STOP_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 120.0
CORE_PACKAGES = (
    "minipd.api",
    "minipd.router",
    "minipd.disagg",
    "minipd.control",
    "minipd.engine",
    "minipd.policy",
    "minipd.slo",
    "minipd.tracing",
    "minipd.models",
    "minipd.transports",
)
# what a router run without operations flags must not have loaded: the top-level names of the
# packages, or minipd.ops.<package>
# (and no KV tier's client: redis, mooncake, imported only when a tier is opened with --kv-tier)
FORBIDDEN = (
    *("minipd.ops.planner", "minipd.ops.registry", "aetcd", "etcd3", "grpc", "ray", "opentelemetry"),
    *("redis", "mooncake"),
)
REGISTRY_FLAG_PARSER = {"minipd.ops.registry", "minipd.ops.registry.etcd_url"}  # the `--registry` value's type


def _imported(importtime_log: str) -> set[str]:
    """Module names from `-X importtime` lines: `import time: self | cumulative | name`."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime_log.splitlines() if line.startswith("import time:")}


def _forbidden(modules: set[str]) -> list[str]:
    return sorted(
        m for m in modules - REGISTRY_FLAG_PARSER if any(m == name or m.startswith(name + ".") for name in FORBIDDEN)
    )


def _get(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read()


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def test_the_forbidden_check_names_what_it_finds():
    loaded = {"minipd.router.router", "minipd.ops.dashboard.routes", *REGISTRY_FLAG_PARSER}
    assert _forbidden(loaded) == []
    loaded |= {"minipd.ops.planner.simulator", "minipd.ops.registry.session", "aetcd", "ray._private", "opentelemetry"}
    assert _forbidden(loaded) == [
        "aetcd",
        "minipd.ops.planner.simulator",
        "minipd.ops.registry.session",
        "opentelemetry",
        "ray._private",
    ]
    assert _forbidden({"rayon", "grpcio_like", "minipd.ops.planners"}) == []  # names, not prefixes of names


@pytest.mark.timeout(240)
def test_a_plain_router_serves_with_its_dashboard_and_no_planner_registry_ray_or_tracing(tmp_path):
    secret = secrets.token_hex(16)
    decode = Process(["--role", "decode", "--host", "127.0.0.1", "--port", "0", "--model", "tiny"], secret)
    stderr_path = tmp_path / "router-stderr.txt"
    try:
        host, port = decode.address
        argv = ["--role", "router", "--host", "127.0.0.1", "--port", "0", "--http-port", "0"]
        with stderr_path.open("w") as stderr:
            router = subprocess.Popen(
                [sys.executable, "-X", "importtime", "-m", "minipd", *argv, "--decode", f"{host}:{port}"],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env={**os.environ, CLUSTER_SECRET_ENV: secret},
            )
            try:
                ready, http = None, None
                for line in router.stdout:  # up to the READY line; none when stdout closes (the router exited)
                    if line.startswith("minipd: serving the OpenAI API"):
                        http = line.split()[-1]
                    if line.startswith("READY router"):
                        ready = line
                        break
                assert ready, f"the router did not start: {stderr_path.read_text()[-2000:]}"
                chat = _post(
                    f"{http}/v1/chat/completions",
                    {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
                )
                page = _get(f"{http}/dashboard")
                snapshot = json.loads(_get(f"{http}/dashboard/snapshot")[2])
            finally:
                # -X importtime writes each import as it happens, so how the router stops does not matter
                router.kill()
                router.wait(STOP_TIMEOUT_S)
    finally:
        decode.stop()
    modules = _imported(stderr_path.read_text())
    assert chat["usage"]["completion_tokens"] == 4  # the request path: served by the decode instance
    status, content_type, body = page
    assert status == 200 and content_type.startswith("text/html") and b"<html" in body.lower()
    assert isinstance(snapshot, dict) and snapshot  # the dashboard's data, from the router
    # the check sees the core's own imports and the operations the command line plugs in ...
    assert {"minipd.router.router", "minipd.router.attempt", "minipd.api.serving"} <= modules
    assert {"minipd.ops.dashboard.routes", "minipd.ops.admin.admin"} <= modules
    # ... and none of the planner's, the registry's, Ray's or OpenTelemetry's
    assert _forbidden(modules) == []


CORE_IMPORTER = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys
    imported, skipped = [], []
    for package in sys.argv[1:]:
        path = importlib.import_module(package).__path__
        names = [package] + [m.name for m in pkgutil.walk_packages(path, package + ".")]
        for name in names:
            try:
                importlib.import_module(name)
                imported.append(name)
            except ModuleNotFoundError as exc:  # an optional extra (ucx, nixl), not minipd's own
                if (exc.name or "").startswith("minipd"):
                    raise
                skipped.append(name)
    print(json.dumps({"imported": imported, "skipped": skipped, "modules": sorted(sys.modules)}))
    """
)


@pytest.mark.timeout(120)
def test_importing_every_core_module_loads_no_operation():
    proc = subprocess.run(
        [sys.executable, "-c", CORE_IMPORTER, *CORE_PACKAGES], capture_output=True, text=True, timeout=110
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert {"minipd.router.router", "minipd.api.app", "minipd.disagg.instance", "minipd.transports.tcp"} <= set(
        result["imported"]
    )
    assert [m for m in result["modules"] if m == "minipd.ops" or m.startswith("minipd.ops.")] == []
    assert _forbidden(set(result["modules"])) == []
