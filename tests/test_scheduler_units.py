"""The scheduler on its own, without a model: admission order, the token budget, chunking,
preemption order, adopted requests, max_num_seqs, and requests whose KV streams out."""

from __future__ import annotations

from minipd.engine.block_manager import BlockManager
from minipd.engine.request import Request, RequestStatus
from minipd.engine.sampling_params import SamplingParams
from minipd.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput

BS = 4


def make(num_blocks: int = 64, budget: int = 64, max_num_seqs: int = 8, chunked: bool = True,
         max_model_len: int = 64, caching: bool = False) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
                             enable_chunked_prefill=chunked)
    return Scheduler(config, BlockManager(num_blocks, BS, caching))


def request(name: str, num_tokens: int, start: int = 0) -> Request:
    return Request(name, list(range(start, start + num_tokens)), SamplingParams(max_tokens=100))


def run(scheduler: Scheduler) -> SchedulerOutput:
    """One step as the engine runs it: schedule, then advance progress and append a token to
    every chunk that samples."""
    output = scheduler.schedule()
    scheduler.update_computed(output)
    for chunk in output.chunks:
        if chunk.samples:
            chunk.request.token_ids.append(7)
    return output


def scheduled(output: SchedulerOutput) -> list[tuple[str, int]]:
    return [(c.request.request_id, c.num_new_tokens) for c in output.chunks]


def test_waiting_requests_are_admitted_oldest_first_within_the_token_budget():
    s = make(budget=64)
    for name in "abc":
        s.add(request(name, 30))
    assert scheduled(run(s)) == [("a", 30), ("b", 30), ("c", 4)]  # c's first chunk fills the budget
    assert [r.request_id for r in s.running] == ["a", "b", "c"]


def test_running_requests_go_before_waiting_ones_and_decode_one_token_each():
    s = make(budget=64)
    s.add(request("a", 10))
    run(s)
    s.add(request("b", 60))
    assert scheduled(run(s)) == [("a", 1), ("b", 60)]
    assert scheduled(run(s)) == [("a", 1), ("b", 1)]


def test_a_long_prompt_is_chunked_at_the_budget_and_samples_only_at_its_end():
    s = make(budget=16)
    s.add(request("long", 40))
    outputs = [run(s) for _ in range(3)]
    assert [scheduled(o) for o in outputs] == [[("long", 16)], [("long", 16)], [("long", 8)]]
    assert [o.chunks[0].samples for o in outputs] == [False, False, True]


def test_without_chunking_a_prompt_waits_for_a_step_with_room_for_all_of_it():
    s = make(budget=64, chunked=False)
    s.add(request("a", 40))
    s.add(request("b", 40))
    assert scheduled(run(s)) == [("a", 40)]  # b does not fit beside a: no partial chunk
    assert scheduled(run(s)) == [("a", 1), ("b", 40)]


def test_max_num_seqs_caps_running_requests_and_the_rest_wait_in_order():
    s = make(max_num_seqs=2)
    for name in "abc":
        s.add(request(name, 4))
    run(s)
    assert [r.request_id for r in s.running] == ["a", "b"] and [r.request_id for r in s.waiting] == ["c"]
    s.finish(s.running[0])
    assert scheduled(run(s)) == [("b", 1), ("c", 4)]


def test_when_blocks_run_out_the_newest_running_request_is_preempted_and_resumes_first():
    s = make(num_blocks=4, budget=64)  # 16 token slots
    s.add(request("old", 8))  # two blocks, the second full: its first decode needs a third
    s.add(request("new", 8, start=100))
    run(s)
    assert s.block_manager.num_free_blocks == 0
    output = run(s)
    assert [r.request_id for r in output.preempted] == ["new"] and scheduled(output) == [("old", 1)]
    new = s.waiting[0]
    assert new.request_id == "new" and new.status is RequestStatus.WAITING and new.block_ids == []
    assert new.num_computed_tokens == 0 and new.num_preemptions == 1 == s.num_preemptions
    s.finish(s.running[0])
    assert scheduled(run(s)) == [("new", 9)]  # recomputed, its sampled token included


def test_a_request_whose_kv_streams_out_is_never_the_preemption_victim():
    s = make(num_blocks=5, budget=14)
    s.add(request("decoding", 8))
    streaming = request("streaming", 12, start=100)
    streaming.kv_sink = object()  # any sink: the scheduler only asks `is_preemptible`
    s.add(streaming)
    assert scheduled(run(s)) == [("decoding", 8), ("streaming", 6)]  # streaming holds all 3 of its blocks
    assert s.block_manager.num_free_blocks == 0
    output = run(s)  # decoding needs a third block; the newest request streams out, so decoding yields
    assert [r.request_id for r in output.preempted] == ["decoding"]
    assert scheduled(output) == [("streaming", 6)] and len(streaming.block_ids) == 3


def test_adopted_requests_are_admitted_with_their_blocks_and_only_decode():
    s = make(max_num_seqs=1)
    bm = s.block_manager
    adopted = request("adopted", 10)
    adopted.block_ids, _ = bm.allocate(adopted.token_ids)  # the KV that landed from a prefill instance
    adopted.num_computed_tokens = adopted.num_tokens
    adopted.token_ids.append(3)  # the first token, sampled by the prefill instance
    s.add(request("local", 5, start=50))
    s.add(adopted)
    assert scheduled(run(s)) == [("local", 5)]  # max_num_seqs=1: the adopted one waits its turn
    s.finish(s.running[0])
    free_before = bm.num_free_blocks
    assert scheduled(run(s)) == [("adopted", 1)]
    assert bm.num_free_blocks == free_before  # its 11th token still fits in its third block


def test_finish_frees_or_hands_over_the_blocks_once():
    s = make()
    a, b = request("a", 8), request("b", 8, start=50)
    s.add(a)
    s.add(b)
    run(s)
    assert s.finish(a) == [] and s.block_manager.usage().num_used == 2
    handed = s.finish(b, free_blocks=False)
    assert len(handed) == 2 and b.block_ids == [] and s.finish(b) == []
    s.block_manager.free(handed)
    assert s.block_manager.usage().num_used == 0
