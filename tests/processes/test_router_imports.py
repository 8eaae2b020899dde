"""A serving router loads no planner: the policies it runs live in minipd.policy and its SLO
in minipd.slo, below the planner, and `minipd --role router` imports neither the simulator nor
the planner's command line; nor Ray (a router the Ray launcher starts scales pools over its
scale link: tests/processes/test_ray_scaling.py checks that one has not loaded Ray either).

The check is the real process: `python -X importtime` reports every module a process imports
on stderr, so the router is started with it, with its HTTP API and the live ratio controller
(the parts that use the policies), asked for a dashboard plan (which its plan worker, another
process, simulates), killed then, and its imports are read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from minipd.entrypoints.cli import PLANNER_COMMANDS
from minipd.ops.planner.__main__ import COMMANDS

STOP_TIMEOUT_S = 30.0
ROUTER_ARGV = (
    "--role router --host 127.0.0.1 --port 0 --http-port 0 --ratio-controller --controller-slo ttft:2000 tpot:50"
)


PLAN = {"num_instances": 2, "num_prefill": 1, "rate_rps": 2, "num_requests": 20}


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def _imported(importtime_log: str) -> set[str]:
    """Module names from `-X importtime` lines: `import time: self | cumulative | name`."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime_log.splitlines() if line.startswith("import time:")}


@pytest.mark.timeout(120)
def test_a_running_router_has_imported_no_planner_module(tmp_path):
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        router = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "minipd", *ROUTER_ARGV.split()],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            # up to the first READY line; none when stdout closes: the router exited without starting
            ready, http = None, None
            for line in router.stdout:
                if line.startswith("minipd: serving the OpenAI API"):
                    http = line.split()[-1]
                if line.startswith("READY router"):
                    ready = line
                    break
            if ready:
                answer = _post(f"{http}/dashboard/plan", PLAN)
        finally:
            # -X importtime writes each import as it happens, so how the router stops does not matter
            router.kill()
            router.wait(STOP_TIMEOUT_S)
    modules = _imported(stderr_path.read_text())
    assert ready, f"the router did not start: {stderr_path.read_text()[-2000:]}"
    assert [b["label"] for b in answer["bars"]] == ["colocated x2", "1P:1D"]  # the simulator answered
    # the check sees the router's own imports, policies included ...
    assert {
        "minipd.router.router",
        "minipd.ops.control_loop.live_controller",
        "minipd.policy.ratio_controller",
    } <= modules
    assert {"minipd.ops.control_loop.pool_scaler", "minipd.policy.pool_scaling"} <= modules
    # ... and none of the planner's, nor Ray (the Ray launcher's actuator is the launcher's own)
    assert sorted(m for m in modules if m == "minipd.ops.planner" or m.startswith("minipd.ops.planner.")) == []
    assert sorted(m for m in modules if m == "ray" or m.startswith("ray.")) == []


def test_the_command_line_knows_the_planners_commands():
    assert tuple(COMMANDS) == PLANNER_COMMANDS
