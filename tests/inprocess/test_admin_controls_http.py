"""The router's control calls over HTTP on an in-process cluster (real control plane over TCP,
loopback KV): bad input refused with a 4xx naming the field; the cluster flipped between
colocated and a split with requests under way and none lost; a KV link cap that slows the next
transfer and is lifted again; the ratio controller turned on, re-aimed and off; the built-in
load run, refused a second time while it runs, and stopped."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from disagg_helpers import CONFIG
from http_helpers import http_json, http_post

from minipd.api.app import HttpConfig, build_app, start_http_server
from minipd.api.router_backend import RouterBackend
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.inprocess_cluster import InProcessCluster
from minipd.ops.admin.admin import router_admin
from minipd.ops.admin.admin_controls import router_controls
from minipd.ops.control_loop.controller_switch import ControllerSwitch
from minipd.ops.control_loop.live_controller import LiveControllerOptions
from minipd.policy.ratio_controller import ControllerConfig
from minipd.slo.targets import SLO
from minipd.transports.link_limiter import DEFAULT_BURST_BYTES

WAIT_S = 60.0
PROMPT_LEN = 300  # remote prefill: far above the local-prefill threshold


@pytest.fixture(scope="module")
def cluster(loop_thread):
    cluster = loop_thread.run(InProcessCluster.start(CONFIG, num_prefill=1, num_decode=1))
    yield cluster
    loop_thread.run(cluster.close())


@pytest.fixture(scope="module")
def controller(cluster):
    policy = ControllerConfig(slo=SLO(ttft_s=1.0, itl_s=0.1), min_samples=1)
    return ControllerSwitch(cluster.router, policy, LiveControllerOptions(interval_s=0.05))


def _serve(loop_thread, cluster, controller, config: HttpConfig):
    extensions = [router_admin(cluster.router), router_controls(cluster.router, controller)]
    app = build_app(RouterBackend(cluster.router, "tiny"), config, extensions=extensions)
    return loop_thread.run(start_http_server(app, "127.0.0.1", 0))


@pytest.fixture(scope="module")
def url(cluster, controller, loop_thread):
    runner, port = _serve(loop_thread, cluster, controller, HttpConfig())
    yield f"http://127.0.0.1:{port}"
    loop_thread.run(controller.stop())
    loop_thread.run(runner.cleanup())


def roles(cluster) -> dict[str, str]:
    return {h.instance_id: h.role.value for h in cluster.router.registry.alive()}


def wait_for(predicate, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)  # polling a state another thread changes, bounded by the deadline
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(
    "path, body, status, param, words",
    [
        ("/admin/link_cap", {"instance": "nobody", "gbps": 1.0}, 404, "instance", ["'nobody'", "prefill-0"]),
        ("/admin/link_cap", {"instance": "prefill-0", "gbps": -1.0}, 400, "gbps", ["positive"]),
        ("/admin/link_cap", {"instance": "prefill-0", "gbps": 0}, 400, "gbps", ["null to lift"]),
        ("/admin/link_cap", {"instance": "prefill-0"}, 400, "gbps", ["required"]),
        ("/admin/link_cap", {"instance": "prefill-0", "gbps": "fast"}, 400, "gbps", ["float"]),
        ("/admin/link_cap", {"instance": "prefill-0", "gbps": 1e-300}, 400, "gbps", ["from 0.001 to 10000"]),
        ("/admin/link_cap", {"instance": "prefill-0", "gbps": 1e308}, 400, "gbps", ["from 0.001 to 10000"]),
        ("/admin/link_cap", {"instance": "decode-0", "gbps": 1.0}, 409, "instance", ["decode instance", "no KV"]),
        ("/admin/cluster_mode", {"mode": "mixed"}, 400, "mode", ["'mixed'", "colocated, split"]),
        ("/admin/cluster_mode", {"mode": "split"}, 400, "prefill", ["number of prefill"]),
        ("/admin/cluster_mode", {"mode": "split", "prefill": 2}, 400, "prefill", ["1 to 1 of 2"]),
        ("/admin/cluster_mode", {"mode": "colocated", "prefill": 1}, 400, "prefill", ["only a split"]),
        ("/admin/cluster_mode", {"mode": "colocated", "drain_timeout_s": 0}, 400, "drain_timeout_s", ["positive"]),
        ("/admin/cluster_mode", {"mode": "colocated", "drain_timeout_s": 1e308}, 400, "drain_timeout_s", ["3600"]),
        ("/admin/cluster_mode", {"mode": "colocated", "urgent": 1}, 400, "urgent", ["unknown field"]),
        ("/admin/load", {"workload": "chatty", "rate": 1.0}, 400, "workload", ["'chatty'", "prefill-heavy"]),
        ("/admin/load", {"workload": "mixed"}, 400, "rate", ["rate", "concurrency"]),
        ("/admin/load", {"workload": "mixed", "rate": 1.0, "concurrency": 2}, 400, "rate", ["not both"]),
        ("/admin/load", {"workload": "mixed", "rate": -2.0}, 400, "rate", ["-2.0"]),
        ("/admin/load", {"workload": "mixed", "concurrency": 0}, 400, "concurrency", ["[1, 256]"]),
        ("/admin/load", {"workload": "mixed", "rate": 1.0, "num_requests": 0}, 400, "num_requests", ["[1,"]),
        ("/admin/load", {"workload": "mixed", "rate": 1.0, "duration_s": -1}, 400, "duration_s", ["seconds"]),
        ("/admin/load", {"workload": "decode-heavy", "rate": 1, "prompt_len": "huge"}, 400, "prompt_len", ["huge"]),
        (
            "/admin/load",
            {"workload": "decode-heavy", "rate": 1, "prompt_len": "lognormal:inf:1:1:100"},
            400,
            "prompt_len",
            ["median", "inf"],
        ),
        (
            "/admin/load",
            {"workload": "decode-heavy", "rate": 1, "prompt_len": "lognormal:100:1e308"},
            400,
            "prompt_len",
            ["sigma", "[0, 5]"],
        ),
        ("/admin/load", {"workload": "mixed", "rate": 1e-300}, 400, "rate", ["0.001"]),
        ("/admin/load", {"workload": "mixed", "rate": 1, "output_len": "fixed:4"}, 400, "output_len", ["mixes"]),
        ("/admin/load", {"workload": "decode-heavy", "rate": 1, "output_len": "fixed:600"}, 400, "output_len", ["512"]),
        ("/admin/load/stop", {}, 409, None, ["no load run"]),
        ("/admin/load/stop", {"now": True}, 400, "now", ["unknown field"]),
        ("/admin/controller", {"on": "yes"}, 400, "on", ["bool"]),
        ("/admin/controller", {"slo": {"ttft_ms": -5}}, 400, "slo", ["ttft_ms", "positive"]),
        ("/admin/controller", {"slo": {"ttft_ms": 500}}, 400, "slo", ["itl or tpot"]),
        ("/admin/controller", {"target": 1.5}, 400, "target", ["(0, 1]"]),
        ("/admin/controller", {"slo": {"ttft": 5}}, 400, "slo.ttft", ["unknown field"]),
        ("/admin/controller", {"slo": {"ttft_ms": 9, "itl_ms": 5, "tpot_ms": 5}}, 400, "slo", ["itl_ms or tpot_ms"]),
        ("/admin/controller", {"slo": {"ttft_ms": 1e308, "itl_ms": 5}}, 400, "slo", ["ttft_ms", "3600000"]),
        ("/admin/load", b"{not json", 400, None, ["not valid JSON"]),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_changes(
    url, cluster, controller, path, body, status, param, words
):
    result = http_json("POST", f"{url}{path}", body)
    assert result.status == status, result.body
    error = result.body["error"]
    assert error["param"] == param, error
    assert all(word in error["message"] for word in words), error["message"]
    assert roles(cluster) == {"prefill-0": "prefill", "decode-0": "decode"}
    assert not controller.on and controller.config.target == 0.9
    assert controller.config.slo == SLO(ttft_s=1.0, itl_s=0.1)
    assert http_json("GET", f"{url}/admin/load").body["state"] == "idle"
    assert [i.transport.link_gbps for i in cluster.instances] == [None, None]


def test_every_control_route_needs_the_api_key(cluster, controller, loop_thread):
    runner, port = _serve(loop_thread, cluster, controller, HttpConfig(api_key="controls-key"))
    base = f"http://127.0.0.1:{port}"
    try:
        for path, body in [
            ("/admin/cluster_mode", b'{"mode": "colocated"}'),
            ("/admin/link_cap", b'{"instance": "prefill-0", "gbps": 1}'),
            ("/admin/load", b'{"workload": "mixed", "rate": 1}'),
            ("/admin/load/stop", b"{}"),
            ("/admin/controller", b'{"on": true}'),
        ]:
            refused = http_post(f"{base}{path}", body, {"Content-Type": "application/json"})
            assert refused.status == 401, (path, refused.body)
        for path in ("/admin/link_cap", "/admin/load", "/admin/controller"):
            assert http_json("GET", f"{base}{path}").status == 401
    finally:
        loop_thread.run(runner.cleanup())
    assert roles(cluster) == {"prefill-0": "prefill", "decode-0": "decode"} and not controller.on


async def _generate(cluster, prompt: list[int], max_tokens: int):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outputs = [out async for out in cluster.router.generate(prompt, params)]
    return outputs


def _prompt(rng: random.Random, n: int = PROMPT_LEN) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


def test_the_cluster_flips_to_colocated_and_back_to_a_split_losing_no_request(url, cluster, loop_thread):
    rng = random.Random(7)
    for mode, body, expected in [
        ("colocated", {"mode": "colocated"}, {"prefill-0": "both", "decode-0": "both"}),
        ("split", {"mode": "split", "prefill": 1}, {"prefill-0": "prefill", "decode-0": "decode"}),
    ]:
        # requests under way while the instances switch one after the other
        running = [
            asyncio.run_coroutine_threadsafe(_generate(cluster, _prompt(rng), 40), loop_thread.loop) for _ in range(4)
        ]
        result = http_json("POST", f"{url}/admin/cluster_mode", body)
        assert result.status == 200, result.body
        report = result.body
        assert report["mode"] == mode and len(report["switches"]) == 2
        assert (report["prefill"], report["decode"], report["both"]) == (
            (0, 0, 2) if mode == "colocated" else (1, 1, 0)
        )
        assert roles(cluster) == expected
        listed = {e["instance"]: e["role"] for e in http_json("GET", f"{url}/admin/instances").body["instances"]}
        assert listed == expected
        for future in running:
            last = future.result(WAIT_S)[-1]
            assert last.error is None and last.finish_reason == "length", last.error
            assert sum(len(o.token_ids) for o in future.result()) == 40
    # nothing to move: answered at once with no switch
    again = http_json("POST", f"{url}/admin/cluster_mode", {"mode": "split", "prefill": 1})
    assert again.status == 200 and again.body["switches"] == []


def _transfer_s(cluster, loop_thread, rng: random.Random) -> tuple[float, int]:
    last = loop_thread.run(_generate(cluster, _prompt(rng), 2))[-1]
    assert last.error is None and last.transfer is not None, last.error
    return last.transfer.transfer_s, last.transfer.num_bytes


def test_a_link_cap_slows_the_next_transfer_and_lifting_it_speeds_it_up_again(url, cluster, loop_thread):
    rng = random.Random(11)
    free_s, num_bytes = _transfer_s(cluster, loop_thread, rng)
    # the bucket lets a small burst through at once, the rest goes at the capped rate: 0.5 s of it
    target_s = 0.5
    assert num_bytes > 2 * DEFAULT_BURST_BYTES, num_bytes
    gbps = (num_bytes - DEFAULT_BURST_BYTES) * 8 / target_s / 1e9
    capped = http_json("POST", f"{url}/admin/link_cap", {"instance": "prefill-0", "gbps": gbps})
    assert capped.status == 200, capped.body
    assert capped.body == {"instance": "prefill-0", "role": "prefill", "gbps": gbps, "previous_gbps": None}
    assert cluster.instance("prefill-0").transport.link_gbps == gbps
    try:
        slow_s, slow_bytes = _transfer_s(cluster, loop_thread, rng)
        assert slow_bytes == num_bytes
        assert slow_s >= 0.8 * target_s and slow_s > 5 * free_s, (free_s, slow_s)
        assert http_json("GET", f"{url}/admin/link_cap").body == {"link_caps": {"prefill-0": gbps}}
    finally:
        lifted = http_json("POST", f"{url}/admin/link_cap", {"instance": "prefill-0", "gbps": None})
    assert lifted.status == 200 and lifted.body["gbps"] is None and lifted.body["previous_gbps"] == gbps
    fast_s, _ = _transfer_s(cluster, loop_thread, rng)
    assert fast_s < slow_s / 3, (fast_s, slow_s)


def test_the_ratio_controller_is_turned_on_given_an_slo_and_turned_off(url, cluster, controller):
    on = http_json("POST", f"{url}/admin/controller", {"on": True})
    assert on.status == 200 and on.body["on"] is True
    assert on.body["leader"] is True and on.body["leader_id"] is None  # no registry: no election
    assert on.body["slo"] == {"ttft_ms": 1000.0, "itl_ms": 100.0}
    assert cluster.router.latency_observer is controller.controller  # it hears every token now
    decided = wait_for(lambda: http_json("GET", f"{url}/admin/controller").body["last_decision"], "a decision")
    assert decided["move"] == "hold" and decided["reason"]
    first = controller.controller
    aimed = http_json("POST", f"{url}/admin/controller", {"slo": {"ttft_ms": 800, "tpot_ms": 50}, "target": 0.8})
    assert aimed.status == 200 and aimed.body["on"] is True
    assert aimed.body["slo"] == {"ttft_ms": 800.0, "tpot_ms": 50.0} and aimed.body["target"] == 0.8
    assert controller.controller is not first and controller.controller.policy.config.slo == SLO(
        ttft_s=0.8, tpot_s=0.05
    )
    off = http_json("POST", f"{url}/admin/controller", {"on": False})
    assert off.status == 200 and off.body["on"] is False and off.body["last_decision"] is None
    assert off.body["leader"] is False
    assert cluster.router.latency_observer is None
    assert roles(cluster) == {"prefill-0": "prefill", "decode-0": "decode"}


def test_the_built_in_load_runs_reports_progress_refuses_a_second_run_and_stops(url, cluster):
    body = {
        "workload": "prefill-heavy",
        "concurrency": 2,
        "num_requests": 6,
        "prompt_len": "uniform:100:200",
        "output_len": "fixed:8",
    }
    started = http_json("POST", f"{url}/admin/load", body)
    assert started.status == 200, started.body
    assert started.body["state"] == "running" and started.body["num_requests"] == 6
    assert started.body["arrivals"] == "concurrency 2"
    second = http_json("POST", f"{url}/admin/load", {**body, "workload": "decode-heavy"})
    assert second.status == 409 and second.body["error"]["param"] == "workload", second.body
    assert "under way" in second.body["error"]["message"]
    done = wait_for(
        lambda: (p := http_json("GET", f"{url}/admin/load").body)["state"] != "running" and p, "the run to end"
    )
    assert (done["state"], done["reason"]) == ("finished", "all requests done"), done
    assert (done["sent"], done["completed"], done["failed"], done["in_flight"]) == (6, 6, 0, 0), done["errors"]
    assert done["output_tokens"] == 6 * 8 and done["elapsed_s"] > 0
    assert done["ttft_s"]["count"] == 6 and 0 < done["ttft_s"]["p50"] <= done["ttft_s"]["p99"]
    assert done["itl_s"]["count"] > 0 and done["itl_s"]["p90"] > 0

    # a long run, stopped midway: its requests in flight are aborted, the cluster serves on
    long = http_json("POST", f"{url}/admin/load", {**body, "num_requests": 500, "output_len": "fixed:64"})
    assert long.status == 200, long.body
    wait_for(lambda: http_json("GET", f"{url}/admin/load").body["completed"] >= 1, "a first request done")
    stopped = http_json("POST", f"{url}/admin/load/stop", {})
    assert stopped.status == 200 and (stopped.body["state"], stopped.body["reason"]) == ("stopped", "stopped")
    assert 1 <= stopped.body["completed"] < 500
    wait_for(lambda: not cluster.router._requests, "the stopped run's requests to end")
    assert all(h.is_alive and not h.draining for h in cluster.router.registry.instances.values())


def test_the_documented_lognormal_lengths_run_fitted_to_the_model(url, cluster):
    # docs/cluster-operations.md's form, without `:LO:HI`: it once asked for up to 1,048,576 tokens (refused)
    body = {"workload": "decode-heavy", "concurrency": 3, "num_requests": 3}
    body |= {"prompt_len": "lognormal:200:0.8", "output_len": "lognormal:128:0.6"}
    started = http_json("POST", f"{url}/admin/load", body)
    assert started.status == 200 and started.body["state"] == "running", started.body
    done = wait_for(
        lambda: (p := http_json("GET", f"{url}/admin/load").body)["state"] != "running" and p, "the run to end"
    )
    assert (done["state"], done["completed"], done["failed"]) == ("finished", 3, 0), done["errors"]
