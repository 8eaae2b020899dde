"""The dashboard's snapshot builder over a known window: percentiles, SLO attainment and the
verdict, the KV links and request records, the SLO's source, instance rows of a router with 64
instances (liveness, pools, step rate, the lost ones kept as dead), their KV tier reports
(the live ones'), and the observed backend that feeds the window."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest

from minipd.control.kv_tier_report import KVTierReport
from minipd.control.messages import Stats
from minipd.control.role import Role
from minipd.engine.request import RequestOutput, TransferInfo
from minipd.ops.dashboard.instances import DEAD, DRAINING, STALE, RouterInstances
from minipd.ops.dashboard.observed_backend import ObservedBackend
from minipd.ops.dashboard.request_window import RequestWindow
from minipd.ops.dashboard.snapshot import MET, NO_DATA, VIOLATED, DashboardSLO, SnapshotBuilder
from minipd.slo.targets import SLO


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rows:
    def __init__(self, rows):
        self._rows = rows

    def rows(self):
        return self._rows


def _output(request_id="r1", tokens=(1,), finished=False, transfer=None) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        token_ids=list(tokens),
        text="x",
        finished=finished,
        finish_reason="length" if finished else None,
        num_prompt_tokens=10,
        num_output_tokens=3,
        transfer=transfer,
    )


def _builder(window, rows=(), controller=None, clock=None):
    return SnapshotBuilder(
        window,
        rows if hasattr(rows, "rows") else Rows(list(rows)),
        DashboardSLO(1.0, 0.1),
        "router",
        {"role_switch": True},
        lambda: controller,
        clock=clock or time.monotonic,
    )


def test_percentiles_attainment_and_verdict():
    clock = Clock()
    window = RequestWindow(window_s=60, clock=clock)
    builder = _builder(window, clock=clock)
    assert builder.build()["attainment"]["verdict"] == NO_DATA
    ttfts = np.linspace(0.1, 2.0, 20)  # 9 of 20 within 1.0 s
    for ttft in ttfts:
        window.first_token(float(ttft))
    for _ in range(50):
        window.gap(0.01)
    snap = builder.build()
    assert snap["latency"]["ttft"]["p50"] == pytest.approx(float(np.percentile(ttfts, 50)))
    assert snap["latency"]["ttft"]["p99"] == pytest.approx(float(np.percentile(ttfts, 99)))
    assert snap["latency"]["itl"]["count"] == 50
    assert snap["attainment"]["ttft"] == pytest.approx(np.mean(ttfts <= 1.0))
    assert snap["attainment"]["itl"] == 1.0
    assert snap["attainment"]["verdict"] == VIOLATED
    builder.set_slo(2.0, 0.1)
    snap = builder.build()
    assert snap["attainment"]["verdict"] == MET and snap["slo"] == {"ttft_s": 2.0, "itl_s": 0.1, "source": "page"}
    assert snap["series"]["verdict"] == [NO_DATA, VIOLATED, MET]
    assert len(snap["series"]["ttft_p90"]) == 3 and snap["series"]["ttft_p90"][0] is None
    msgspec.json.encode(snap)  # what the hub sends: every value encodes
    clock.now += 61  # every sample leaves the window
    assert builder.build()["latency"]["ttft"]["count"] == 0


def test_links_records_and_totals():
    clock = Clock()
    window = RequestWindow(window_s=60, clock=clock)
    builder = _builder(window, clock=clock)
    transfer = TransferInfo("prefill-0", "decode-1", 4096, 0, 0, 0.01, 0.004, 0.001)
    clock.now += 10
    window.finished(_output("a", finished=True, transfer=transfer), 0.05, 0.01)
    window.finished(_output("b", finished=True, transfer=transfer), 0.06, None)
    window.finished(_output("c", finished=True), 0.01, None)  # prefilled where it decoded
    snap = builder.build()
    (link,) = snap["links"]
    assert link == {"prefill": "prefill-0", "decode": "decode-1", "bytes": 8192, "requests": 2, "bytes_per_s": 819.2}
    assert [r["request_id"] for r in snap["requests"]] == ["c", "b", "a"]  # newest first
    assert snap["requests"][2]["kv_bytes"] == 4096 and snap["requests"][2]["exposed_s"] == 0.001
    assert snap["requests"][0]["prefill_instance"] is None
    assert snap["totals"] == {"requests": 3, "kv_bytes": 8192}


def test_the_controllers_slo_and_state_unless_the_page_set_one():
    from minipd.policy.ratio_controller import ControllerConfig, Decision, Move

    config = ControllerConfig(slo=SLO(ttft_s=0.5, tpot_s=0.02), target=0.8)
    controller = SimpleNamespace(
        policy=SimpleNamespace(config=config),
        last_decision=Decision(1.0, Move.TO_PREFILL, "ttft attainment 0.50 < 0.80", 0.5, float("nan")),
        moves=[],
    )
    builder = _builder(RequestWindow(), controller=controller)
    snap = builder.build()
    assert snap["slo"] == {"ttft_s": 0.5, "itl_s": 0.02, "source": "controller"}
    assert snap["attainment"]["target"] == 0.8
    decision = snap["controller"]["last_decision"]
    assert decision["move"] == Move.TO_PREFILL.value and decision["decode_attainment"] is None  # nan is not JSON
    builder.set_slo(0.3, 0.03)
    assert builder.build()["slo"]["source"] == "page"


class FakeHandle:
    def __init__(self, i: int, role: Role):
        self.instance_id = f"inst-{i:02d}"
        self.role, self.epoch, self.draining, self.evicted = role, 0, False, False
        self.welcome = SimpleNamespace(compute=f"node{i // 8}/cpu:{i % 8}")
        self.num_inflight = 0
        self.alive, self.stale = True, False
        self.stats_at = 0.0
        self.stats = None

    @property
    def is_alive(self):
        return self.alive

    @property
    def is_stale(self):
        return self.stale

    def report(self, steps: int, at: float, used: int = 3) -> None:
        self.stats = Stats(
            instance_id=self.instance_id,
            role=self.role,
            num_running=1,
            num_waiting=2,
            num_free_blocks=100 - used,
            num_used_blocks=used,
            num_cached_blocks=1,
            num_blocks=100,
            num_fencing_blocks=4,
            num_steps=steps,
        )
        self.stats_at = at


def test_router_rows_of_64_instances():
    handles = [FakeHandle(i, (Role.PREFILL, Role.DECODE, Role.BOTH, Role.DECODE)[i % 4]) for i in range(64)]
    router = SimpleNamespace(registry=SimpleNamespace(instances={h.instance_id: h for h in handles}))
    table = RouterInstances(router, dead_kept_s=60)
    for h in handles:
        h.report(steps=10, at=1.0)
    rows = {r["instance"]: r for r in table.rows()}
    assert len(rows) == 64 and rows["inst-00"]["step_rate"] is None  # one report: no rate yet
    for h in handles:
        h.report(steps=30, at=3.0)
    handles[1].draining, handles[2].stale = True, True
    builder = _builder(RequestWindow(), table)
    started = time.perf_counter()
    snap = builder.build()
    elapsed = time.perf_counter() - started
    assert elapsed < 0.05, f"one snapshot of 64 instances took {elapsed * 1e3:.1f} ms"
    pools = snap["pools"]
    assert (len(pools["prefill"]), len(pools["decode"]), len(pools["colocated"])) == (16, 32, 16)
    row = next(r for r in pools["prefill"] if r["instance"] == "inst-00")
    assert row["step_rate"] == 10.0 and row["blocks"] == {
        "total": 100,
        "used": 3,
        "cached": 1,
        "free": 97,
        "fencing": 4,
    }
    assert (row["running"], row["waiting"], row["compute"]) == (1, 2, "node0/cpu:0")
    liveness = {r["instance"]: r["liveness"] for pool in pools.values() for r in pool}
    assert liveness["inst-01"] == DRAINING and liveness["inst-02"] == STALE
    # an instance the registry forgot stays on the page as dead, until it registers again
    lost = router.registry.instances.pop("inst-05")
    dead = {r["instance"]: r for r in table.rows()}["inst-05"]
    assert dead["liveness"] == DEAD and dead["role"] == "decode"
    router.registry.instances["inst-05"] = lost
    assert {r["instance"]: r for r in table.rows()}["inst-05"]["liveness"] == "alive"


class _Stream:
    def __init__(self, outputs):
        self.request_id = outputs[0].request_id
        self._outputs = list(outputs)
        self.aborted = False

    def abort(self):
        self.aborted = True

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        pass

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self._outputs:
            raise StopAsyncIteration
        return self._outputs.pop(0)


def test_observed_backend_feeds_the_window_and_passes_everything_through():
    transfer = TransferInfo("p", "d", 100, 0, 0, 0.01, 0.002, 0.001)
    outputs = [_output(tokens=(1,)), _output(tokens=(2,)), _output(tokens=()), _output(tokens=(3,))]
    outputs.append(_output(tokens=(), finished=True, transfer=transfer))
    inner = SimpleNamespace(
        model_name="m",
        max_model_len=64,
        vocab_size=5,
        submit=lambda prompt, rid, traceparent=None: _Stream(outputs),
        num_waiting=lambda: 7,
    )
    window = RequestWindow()
    backend = ObservedBackend(inner, window)
    assert (backend.model_name, backend.max_model_len, backend.num_waiting()) == ("m", 64, 7)

    async def consume():
        stream = backend.submit(None, "r1", traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        seen = []
        async with stream:
            async for output in stream:
                seen.append(output)
        stream.abort()
        return seen, stream

    seen, stream = asyncio.run(consume())
    assert seen == outputs and stream.inner.aborted
    assert len(window.ttft) == 1 and len(window.itl) == 2  # the empty increment is no gap
    (record,) = window.records
    assert record.kv_bytes == 100 and record.prefill_instance == "p" and record.mean_itl_s is not None
    assert window.num_requests == 1 and window.link_bytes() == {("p", "d"): (100, 1)}


def test_a_stream_left_before_its_end_counts_as_an_abort():
    inner = SimpleNamespace(
        submit=lambda prompt, rid, traceparent=None: _Stream([_output(tokens=(1,)), _output(tokens=(2,))])
    )
    window = RequestWindow()
    backend = ObservedBackend(inner, window)

    async def leave_early():
        stream = backend.submit(None, "r1")
        async with stream:
            async for _ in stream:
                break  # the client went away after its first token

    asyncio.run(leave_early())
    (record,) = window.records
    assert record.finish_reason == "abort" and record.ttft_s is not None and window.num_requests == 1


def test_the_live_instances_kv_tier_reports_reach_the_snapshot():
    handles = [FakeHandle(i, Role.PREFILL if i == 0 else Role.DECODE) for i in range(3)]
    router = SimpleNamespace(registry=SimpleNamespace(instances={h.instance_id: h for h in handles}))
    builder = _builder(RequestWindow(), RouterInstances(router, dead_kept_s=60))
    for h in handles:
        h.report(steps=1, at=1.0)
    assert builder.build()["kv_tier"] is None  # no instance has a tier: the page says so
    for h in handles[:2]:
        h.stats = msgspec.structs.replace(h.stats, kv_tier=KVTierReport(lookup_tokens=64, tier_hit_tokens=16))
    view = builder.build()["kv_tier"]
    assert [i["instance"] for i in view["instances"]] == ["inst-00", "inst-01"]
    assert view["total"]["tier_hit_tokens"] == 32 and view["total"]["tier_hit_rate"] == 0.25
    handles[1].alive = False
    assert [i["instance"] for i in builder.build()["kv_tier"]["instances"]] == ["inst-00"]
