"""Request timelines: the router's (or a colocated front's) stamps of one request placed on its clock (the instances'
offsets aligned from the calls' send and receive times), the phases and events that come out
ordered, the end as finish, error or abort, the bounds (tries, chunks, layers, kept timelines,
the message's lists), and the prefill instance's recorder."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgspec
import pytest

from minipd.control.messages import (
    MAX_TIMELINE_CHUNKS,
    MAX_TIMELINE_LAYERS,
    AnyMessage,
    Prefilled,
    PrefillTimes,
)
from minipd.disagg.prefill_times import UNSENT, PrefillTimesRecorder
from minipd.engine.checked_prompt import CheckedPrompt
from minipd.engine.request import RequestOutput, TransferInfo
from minipd.engine.sampling_params import SamplingParams
from minipd.ops.dashboard.observed_backend import ObservedBackend
from minipd.ops.dashboard.request_window import RequestWindow
from minipd.router.request_timeline import MAX_DETAIL_CHARS, MAX_TRIES, RequestTimeline
from minipd.router.timeline_store import MAX_ENCODED_LIMITS, TimelineStore

ARRIVAL = 1000.0  # the router's monotonic clock


def output(**fields) -> RequestOutput:
    values = dict(request_id="r", token_ids=[], text="", finished=True, finish_reason="length", num_output_tokens=4)
    return RequestOutput(**(values | fields))


def disaggregated(prefill_times: PrefillTimes | None = None) -> RequestTimeline:
    """A request that queued 1 ms, reserved for 2 ms, prefilled (the call answered after 40 ms,
    the instance held it 36 ms), whose KV landed 30 ms after the reservation, and whose first
    token came at 50 ms; it finished at 80 ms."""
    timeline = RequestTimeline("r", ARRIVAL, 100)
    t = timeline.begin_try()
    t.decode, t.prefill = "decode-0", "prefill-0"
    t.reserve_sent = t.reserve_call_sent = ARRIVAL + 0.001
    t.reserve_received = ARRIVAL + 0.003  # the decode instance's origin: 2 ms, within 1 ms
    t.prefill_sent, t.prefill_received = ARRIVAL + 0.004, ARRIVAL + 0.044
    t.prefill_times = prefill_times or PrefillTimes(
        handled_s=0.036,
        compute_start_s=0.001,
        compute_end_s=0.030,
        sent_s=0.034,
        num_chunks=2,
        chunks=[(0.002, 0.012), (0.016, 0.029)],
        layers=[(0.003, 0.020), (0.004, 0.031), UNSENT],
    )
    t.stream_sent = ARRIVAL + 0.045
    timeline.kv_landed(landed_after_s=0.030, ordered_after_s=0.043, adopt_s=0.002)
    timeline.first_token = ARRIVAL + 0.050
    timeline.ended, timeline.output = ARRIVAL + 0.080, output()
    timeline.outcome = "finish"
    return timeline


def phases(d: dict, name: str) -> list[dict]:
    return [p for p in d["phases"] if p["name"] == name]


def event_at(d: dict, name: str) -> float:
    (event,) = [e for e in d["events"] if e["name"] == name]
    return event["at_ms"]


def test_instance_offsets_are_placed_from_the_calls_send_and_receive_times():
    d = disaggregated().as_dict()
    # prefill: sent at 4 ms, answered at 44 ms, held 36 ms: 2 ms each way, so it took the call at 6 ms
    assert d["clock_error_ms"]["prefill-0"] == pytest.approx(2.0)
    (queue,) = phases(d, "prefill_queue")
    (prefill,) = phases(d, "prefill")
    assert (queue["start_ms"], queue["end_ms"]) == pytest.approx((6.0, 7.0))
    assert (prefill["start_ms"], prefill["end_ms"]) == pytest.approx((7.0, 36.0))
    assert [x for c in phases(d, "chunk") for x in (c["start_ms"], c["end_ms"])] == pytest.approx([8, 18, 22, 35])
    assert [c["detail"] for c in phases(d, "chunk")] == ["chunk 1", "chunk 2"]
    # decode: its origin is the reserve call's midpoint (2 ms), the KV landed 30 ms after it
    assert d["clock_error_ms"]["decode-0"] == pytest.approx(1.0)
    assert event_at(d, "kv_landed") == pytest.approx(32.0)
    (transfer,) = phases(d, "kv_transfer")
    assert (transfer["start_ms"], transfer["end_ms"]) == pytest.approx((9.0, 32.0))  # first write to landed
    (exposed,) = phases(d, "kv_exposed")
    assert exposed["start_ms"] == exposed["end_ms"] == pytest.approx(36.0)  # landed before compute ended: none
    (adopt,) = phases(d, "adopt")  # from the Decode's arrival (45 ms: later than the landing) for 2 ms
    assert (adopt["start_ms"], adopt["end_ms"]) == pytest.approx((45.0, 47.0))
    # the layer that sent nothing (cached on the decode side) is left out
    assert [x for layer in d["layers"] for x in layer.values()] == pytest.approx([0, 9, 26, 1, 10, 37])


def test_the_recorder_counts_from_the_prefills_arrival_on_its_own_clock():
    recorder = PrefillTimesRecorder(num_layers=2)
    recorder.received_at -= 0.010  # the Prefill arrived 10 ms ago on this process's clock
    times = recorder.times()
    assert 0.010 <= times.handled_s < 5.0
    assert times.compute_start_s == times.compute_end_s == times.sent_s == pytest.approx(times.handled_s, abs=1e-3)


def test_a_slower_answer_moves_the_origin_by_half_the_extra_round_trip():
    early = disaggregated().as_dict()
    late = disaggregated()
    late.tries[0].prefill_received += 0.010  # 10 ms more on the network: 5 ms each way
    late = late.as_dict()
    assert phases(late, "prefill")[0]["start_ms"] - phases(early, "prefill")[0]["start_ms"] == pytest.approx(5.0)
    assert late["clock_error_ms"]["prefill-0"] == pytest.approx(7.0)


def test_phases_and_events_are_ordered_and_inside_the_request():
    d = disaggregated().as_dict()
    starts = [p["start_ms"] for p in d["phases"]]
    assert starts == sorted(starts)
    assert [e["at_ms"] for e in d["events"]] == sorted(e["at_ms"] for e in d["events"])
    assert [p["name"] for p in d["phases"]][:3] == ["queued", "reserve", "prefill_queue"]
    for p in d["phases"]:
        assert 0.0 <= p["start_ms"] <= p["end_ms"] <= d["duration_ms"]
    assert phases(d, "queued")[0]["end_ms"] == pytest.approx(1.0)  # until the first call (the Reserve)
    assert phases(d, "decode")[0]["start_ms"] == event_at(d, "first_token") == d["ttft_ms"] == pytest.approx(50.0)
    assert event_at(d, "finish") == d["duration_ms"] == pytest.approx(80.0)
    assert (d["outcome"], d["finish_reason"], d["output_tokens"], d["tries"]) == ("finish", "length", 4, 1)


def test_a_local_prefill_is_one_generate_phase_up_to_the_first_token():
    timeline = RequestTimeline("r", ARRIVAL, 3)
    t = timeline.begin_try()
    t.decode, t.local = "decode-0", True
    t.stream_sent = ARRIVAL + 0.0005
    timeline.first_token, timeline.ended, timeline.output = ARRIVAL + 0.010, ARRIVAL + 0.020, output()
    timeline.outcome = "finish"
    d = timeline.as_dict()
    assert [p["name"] for p in d["phases"]] == ["queued", "generate", "decode"]
    (generate,) = phases(d, "generate")
    assert (generate["start_ms"], generate["end_ms"]) == pytest.approx((0.5, 10.0))
    assert generate["where"] == "decode-0"
    assert d["layers"] == [] and d["prefill_instance"] is None


def test_an_abort_and_an_error_end_the_timeline_with_their_event():
    aborted = RequestTimeline("a", ARRIVAL, 3)
    aborted.begin_try().decode = "decode-0"
    aborted.end(RequestOutput.aborted("a", None, 3))
    d = aborted.as_dict()
    assert (d["outcome"], d["error"], d["ttft_ms"]) == ("abort", None, None)
    assert [e["name"] for e in d["events"]] == ["abort"]
    assert "decode" not in {p["name"] for p in d["phases"]}

    failed = RequestTimeline("f", ARRIVAL, 3)
    failed.begin_try()
    failed.try_failed("decode-0 died: connection lost")
    failed.begin_try()
    failed.end(RequestOutput.aborted("f", "no decode instance available " + "x" * 1000, 3))
    d = failed.as_dict()
    assert d["outcome"] == "error" and len(d["error"]) == MAX_DETAIL_CHARS
    assert [e["name"] for e in d["events"]] == ["try_failed", "error"]
    assert d["events"][0]["detail"] == "decode-0 died: connection lost" and d["tries"] == 2

    by_instance = RequestTimeline("i", ARRIVAL, 3)
    by_instance.begin_try()
    by_instance.end(output(finish_reason="abort", error="the KV did not load"))
    assert by_instance.as_dict()["outcome"] == "error"
    left = RequestTimeline("l", ARRIVAL, 3)
    left.begin_try()
    left.end(output(finish_reason="abort"))  # an instance's abort without an error: the caller went away
    assert left.as_dict()["outcome"] == "abort"


def test_tries_past_the_bound_are_counted_not_timed():
    timeline = RequestTimeline("r", ARRIVAL, 3)
    for _ in range(MAX_TRIES + 5):
        timeline.begin_try()
        timeline.try_failed("busy")
    assert len(timeline.tries) == MAX_TRIES and timeline.current is None
    timeline.kv_landed(0.1, 0.1, 0.1)  # nothing to record it on: ignored
    timeline.end(RequestOutput.aborted("r", "overloaded", 3, "overloaded"))
    d = timeline.as_dict()
    assert d["tries"] == MAX_TRIES + 5
    assert sum(e["name"] == "try_failed" for e in d["events"]) == MAX_TRIES


def test_kv_bytes_come_from_the_final_outputs_transfer():
    timeline = disaggregated()
    timeline.output = output(transfer=TransferInfo("prefill-0", "decode-0", 4096, 0, 0, 0.03, 0.02, 0.0))
    d = timeline.as_dict()
    assert (d["kv_bytes"], d["num_chunks"], d["prefill_instance"], d["decode_instance"]) == (
        4096,
        2,
        "prefill-0",
        "decode-0",
    )


def test_the_store_keeps_the_last_n_newest_first_and_encodes_once_per_version():
    store = TimelineStore(capacity=3)
    for i in range(5):
        store.start(f"r{i}", ARRIVAL + i, 3).end(RequestOutput.aborted(f"r{i}", None, 3))  # it adds itself
    assert len(store) == 3 and store.version == 5
    assert [t["request_id"] for t in store.as_dicts()] == ["r4", "r3", "r2"]
    body = store.encoded()
    assert store.encoded() is body  # no new timeline: the same bytes
    assert msgspec.json.decode(body)["version"] == 5
    assert msgspec.json.decode(store.encoded(limit=1))["timelines"] == store.as_dicts(limit=1) == store.as_dicts()[:1]
    wide = TimelineStore(capacity=10)
    for i in range(10):
        wide.start(f"w{i}", ARRIVAL, 3).end(RequestOutput.aborted(f"w{i}", None, 3))
    for limit in range(1, 11):
        assert len(msgspec.json.decode(wide.encoded(limit))["timelines"]) == limit
    assert len(wide._encoded) == MAX_ENCODED_LIMITS < 10  # ten limits asked: a few documents kept
    store.start("r5", ARRIVAL, 3)  # under way: not kept yet
    assert store.version == 5
    store.add(RequestTimeline("r5", ARRIVAL, 3))
    assert [t["request_id"] for t in msgspec.json.decode(store.encoded())["timelines"]] == ["r5", "r4", "r3"]
    with pytest.raises(ValueError, match="capacity"):
        TimelineStore(capacity=0)


def test_the_recorder_times_chunks_and_layers_within_its_bounds():
    async def run() -> PrefillTimes:
        recorder = PrefillTimesRecorder(num_layers=2)
        loop = asyncio.get_running_loop()
        writes = []
        for _ in range(MAX_TIMELINE_CHUNKS + 3):
            for layer in range(2):
                recorder.on_layer(layer)
                write = loop.create_future()
                recorder.layer_sent(layer, write)
                writes.append(write)
        for write in writes:
            write.set_result(None)
        await asyncio.sleep(0)  # the done callbacks run on the loop
        recorder.finished((recorder.received_at, recorder.received_at + 0.001))
        return recorder.times()

    times = asyncio.run(run())
    assert times.num_chunks == MAX_TIMELINE_CHUNKS + 3 and len(times.chunks) == MAX_TIMELINE_CHUNKS
    assert all(0 <= start <= end for start, end in times.chunks)
    assert len(times.layers) == 2 and all(0 <= sent <= landed for sent, landed in times.layers)
    assert times.compute_start_s == 0.0 and times.compute_end_s == pytest.approx(0.001)
    assert times.handled_s >= times.sent_s >= 0

    idle = PrefillTimesRecorder(num_layers=3).times()  # nothing was sent: every layer unsent
    assert idle.layers == [UNSENT] * 3 and idle.chunks == [] and idle.num_chunks == 0
    assert len(PrefillTimesRecorder(num_layers=MAX_TIMELINE_LAYERS + 10).times().layers) == MAX_TIMELINE_LAYERS


def test_the_control_plane_refuses_times_past_their_bounds():
    decoder = msgspec.msgpack.Decoder(AnyMessage)
    fields = dict(
        first_token=1,
        num_cached_tokens=0,
        num_bytes=0,
        compute_s=0.0,
        transfer_s=0.0,
        exposed_s=0.0,
        compute_end_at=0.0,
        first_write_at=0.0,
    )
    ok = PrefillTimes(0.1, 0.0, 0.1, 0.1, 1, [(0.0, 0.1)] * MAX_TIMELINE_CHUNKS, [(0.0, 0.1)] * MAX_TIMELINE_LAYERS)
    assert decoder.decode(msgspec.msgpack.encode(Prefilled(**fields, times=ok))).times == ok
    assert decoder.decode(msgspec.msgpack.encode(Prefilled(**fields))).times is None  # optional
    for too_many in (
        msgspec.structs.replace(ok, chunks=[(0.0, 0.1)] * (MAX_TIMELINE_CHUNKS + 1)),
        msgspec.structs.replace(ok, layers=[(0.0, 0.1)] * (MAX_TIMELINE_LAYERS + 1)),
    ):
        with pytest.raises(msgspec.ValidationError, match="length"):
            decoder.decode(msgspec.msgpack.encode(Prefilled(**fields, times=too_many)))


class Outputs:
    """An engine's stream of known outputs (the colocated front's backend)."""

    def __init__(self, outputs: list[RequestOutput], first_after_s: float):
        self.request_id, self._outputs = outputs[0].request_id, list(outputs)
        self.first_after_s = first_after_s

    def abort(self) -> None:
        pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        pass

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        if not self._outputs:
            raise StopAsyncIteration
        if self.first_after_s:
            await asyncio.sleep(self.first_after_s)  # the engine's queue and prefill (a stand-in's time)
            self.first_after_s = 0.0
        return self._outputs.pop(0)


def test_a_colocated_front_stamps_its_requests_queue_first_token_and_end():
    """Without a router the observed backend keeps the timelines: the engine's queue, then to the
    first token, then decode; a client that leaves early makes it an abort."""
    first = output(token_ids=[7], finished=False, finish_reason=None, queue_time_s=0.004)
    outputs = [first, output(token_ids=[8], finished=False, finish_reason=None), output(token_ids=[9])]
    store = TimelineStore()
    streams = iter([Outputs(outputs, 0.010), Outputs(list(outputs), 0.0)])
    backend = ObservedBackend(SimpleNamespace(submit=lambda *a, **k: next(streams)), RequestWindow(), store, "engine")

    async def serve(read: int) -> None:
        stream = backend.submit(CheckedPrompt([1, 2, 3], SamplingParams()), "r")
        seen = 0
        async with stream:
            async for _ in stream:
                seen += 1
                if seen == read:
                    break

    asyncio.run(serve(read=3))
    asyncio.run(serve(read=1))  # the client leaves after its first token
    left, finished = store.as_dicts()
    assert finished["outcome"] == "finish" and finished["prompt_tokens"] == 3
    assert [p["name"] for p in finished["phases"]] == ["queued", "generate", "decode"]
    queued, generate, decode = finished["phases"]
    assert queued["end_ms"] == pytest.approx(4.0, abs=1.0) and queued["end_ms"] == generate["start_ms"]  # its queue
    assert generate["end_ms"] == finished["ttft_ms"] == decode["start_ms"] >= 10.0 and generate["where"] == "engine"
    assert left["outcome"] == "abort" and [e["name"] for e in left["events"]] == ["first_token", "abort"]
