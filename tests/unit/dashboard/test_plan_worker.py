"""The plan worker and its client, as real processes: the worker answers JSON lines (refusing a
line that is too long or not JSON, and going on), names the field of a bad input, and its
answers are the simulator's; the client caches answers, and a worker that dies, hangs or breaks
the protocol fails one call with a clear error (killed), after which the next call starts a
new one. The worker runs niced below its parent, on its parent's CPUs."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import pytest

from minipd.ops.dashboard.plan_client import MAX_LINE_BYTES, PlanClient, PlanInputError, PlanWorkerError
from minipd.ops.planner import plan_view
from minipd.ops.planner.plan_worker import MAX_LINE_BYTES as WORKER_MAX_LINE_BYTES

TIMEOUT_S = 60.0
PLAN_ARGS = {
    "profile": {"builtin": "llama3-8b-h100"},
    "num_instances": 4,
    "mode": "disaggregated",
    "num_prefill": 2,
    "workload": "prefill-heavy",
    "rate_rps": 20.0,
    "ttft_ms": 400.0,
    "itl_ms": 25.0,
    "target": 0.9,
    "num_requests": 60,
}


@pytest.fixture
def worker():
    process = subprocess.Popen(
        [sys.executable, "-m", "minipd.ops.planner.plan_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        yield process
    finally:
        process.stdin.close()
        try:
            process.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


def exchange(process, line: bytes) -> dict:
    process.stdin.write(line)
    process.stdin.flush()
    return json.loads(process.stdout.readline())


def test_the_caps_agree():
    assert MAX_LINE_BYTES == WORKER_MAX_LINE_BYTES


def test_the_worker_refuses_bad_lines_and_goes_on(worker):
    assert exchange(worker, b"not json\n") == {
        "id": None,
        "ok": False,
        "error": {"field": "line", "message": "not JSON"},
    }
    assert exchange(worker, b"[1, 2]\n")["error"]["field"] == "line"
    too_long = exchange(worker, b'{"id": 1, "op": "ping", "args": {"pad": "' + b"x" * MAX_LINE_BYTES + b'"}}\n')
    assert too_long["ok"] is False and too_long["error"]["field"] == "line"
    assert f"longer than {MAX_LINE_BYTES} bytes" in too_long["error"]["message"]
    unknown = exchange(worker, b'{"id": 2, "op": "unpickle", "args": {}}\n')
    assert unknown["id"] == 2 and unknown["error"]["field"] == "op"
    unknown_profile = {**PLAN_ARGS, "profile": {"builtin": "x"}}
    bad_profile = exchange(worker, json.dumps({"id": 3, "op": "plan", "args": unknown_profile}).encode() + b"\n")
    assert bad_profile["error"]["field"] == "profile" and "unknown built-in" in bad_profile["error"]["message"]
    bad_json = exchange(
        worker, json.dumps({"id": 4, "op": "plan", "args": {**PLAN_ARGS, "profile": {"json": "{]"}}}).encode() + b"\n"
    )
    assert bad_json["error"]["field"] == "profile"
    # after all that, the same process still answers
    pong = exchange(worker, b'{"id": 5, "op": "ping", "args": {}}\n')
    assert pong == {"id": 5, "ok": True, "result": {"pid": worker.pid}}


def test_the_worker_runs_niced_below_its_parent_on_its_cpus(worker):
    exchange(worker, b'{"id": 1, "op": "ping", "args": {}}\n')  # it has started (and niced itself)
    assert os.getpriority(os.PRIO_PROCESS, worker.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
    assert os.sched_getaffinity(worker.pid) == os.sched_getaffinity(0)


def test_a_plan_answer_is_the_simulators(worker):
    answer = exchange(worker, json.dumps({"id": 1, "op": "plan", "args": PLAN_ARGS}).encode() + b"\n")
    assert answer["ok"], answer
    result = answer["result"]
    assert [b["label"] for b in result["bars"]] == ["colocated x4", "1P:3D", "2P:2D", "3P:1D"]
    assert result["selected"]["label"] == "2P:2D"
    assert result["green_zone"] == [b["label"] for b in result["bars"] if b["green"]]
    # the same run in this process, straight from the planner's functions, gives the same figures
    local = plan_view.plan_answer(PLAN_ARGS)
    for mine, theirs in zip(local["bars"], result["bars"]):
        assert (mine["ttft"], mine["itl"], mine["attainment"]) == (theirs["ttft"], theirs["itl"], theirs["attainment"])
    assert result["kv"]["bytes_per_request"] == pytest.approx(result["kv"]["mean_prompt_tokens"] * 131072)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT_S))


def test_the_client_caches_and_names_the_field():
    async def body():
        client = PlanClient()
        try:
            first = await client.call("plan", PLAN_ARGS)
            assert await client.call("plan", dict(PLAN_ARGS)) is first  # from the cache
            assert client.num_started == 1
            with pytest.raises(PlanInputError) as refused:
                await client.call("plan", {**PLAN_ARGS, "profile": {"builtin": "nope"}})
            assert refused.value.field == "profile"
            moved = await client.call("plan", {**PLAN_ARGS, "num_prefill": 3})
            assert moved["selected"]["label"] == "3P:1D"
            assert moved["timing"]["cached"] >= 4  # every bar but none re-simulated; the link search is new
        finally:
            await client.close()
        assert client.process is None

    run(body())


def test_a_dead_worker_fails_one_call_clearly_and_the_next_starts_another():
    async def body():
        client = PlanClient()
        try:
            first = (await client.call("ping", {}))["pid"]
            client.process.kill()
            await client.process.wait()
            # found dead before it took the request: replaced at once
            assert (await client.call("ping", {"n": 1}))["pid"] != first
            # dying while it computes: that call fails, the next one is served by a new worker
            client.argv = [sys.executable, "-c", "import sys; sys.stdin.readline(); sys.exit(3)"]
            client.process.kill()
            await client.process.wait()
            # the code is the child's 3, or 255 where another waiter in this process (a leftover
            # subprocess handle of an earlier test) reaped it first and asyncio could not read it
            with pytest.raises(PlanWorkerError, match=r"exited \(code (3|255)\); the next call starts a new one"):
                await client.call("ping", {"n": 2})
            client.argv = [sys.executable, "-m", "minipd.ops.planner.plan_worker"]
            assert (await client.call("ping", {"n": 3}))["pid"] == client.process.pid
            assert client.num_started == 4
        finally:
            await client.close()

    run(body())


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ("import sys, time; sys.stdin.readline(); time.sleep(60)", r"did not answer within 1 s"),
        ("import sys; sys.stdin.readline(); print('x' * (2 << 20), flush=True)", r"longer than 1048576 bytes"),
        ("import sys; sys.stdin.readline(); print('pickle me', flush=True)", r"not a JSON answer line"),
        ('import sys; sys.stdin.readline(); print(\'{"id": 99, "ok": true}\', flush=True)', r"answered request 99"),
    ],
)
def test_a_worker_that_breaks_the_protocol_is_stopped(script, error):
    async def body():
        client = PlanClient(timeout_s=1.0, argv=[sys.executable, "-c", script])
        try:
            await client.call("ping", {})
        except PlanWorkerError as exc:
            assert client.process is None  # killed, and reaped
            return str(exc)
        finally:
            await client.close()
        raise AssertionError("no error")

    assert re.search(error, run(body()))
