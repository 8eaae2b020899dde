"""The scheduler on its own, without a model: admission order, the token budget, chunking,
preemption order, adopted requests, max_num_seqs, requests whose KV streams out, and that no
load of local and adopted requests can deadlock the pool."""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from minipd.engine.block_manager import BlockManager
from minipd.engine.request import Request, RequestStatus
from minipd.engine.sampling_params import SamplingParams
from minipd.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput

BS = 4


def make(
    num_blocks: int = 64,
    budget: int = 64,
    max_num_seqs: int = 8,
    chunked: bool = True,
    max_model_len: int = 64,
    caching: bool = False,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
    )
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
    output = run(s)  # decoding needs a third block; the only newer request streams out, so decoding waits
    assert output.preempted == [] and scheduled(output) == [("streaming", 6)] and len(streaming.block_ids) == 3
    decoding = s.running[0]
    assert decoding.request_id == "decoding" and len(decoding.block_ids) == 2  # it kept its KV
    s.block_manager.free(s.finish(streaming, free_blocks=False))  # the sink sent its KV and gave the blocks back
    assert scheduled(run(s)) == [("decoding", 1)] and len(decoding.block_ids) == 3


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


# ---- no deadlock under KV pressure --------------------------------------------------------


def finite(name: str, num_tokens: int, max_tokens: int, start: int = 0) -> Request:
    return Request(name, list(range(start, start + num_tokens)), SamplingParams(max_tokens=max_tokens))


def adopt(s: Scheduler, name: str, num_prompt: int, max_tokens: int, start: int) -> Request:
    """Queue a request as a decode instance adopts one: its prompt KV landed in reserved blocks
    and its first token was sampled by the prefill instance."""
    r = finite(name, num_prompt, max_tokens, start)
    r.block_ids, _ = s.block_manager.allocate(r.token_ids)
    r.num_computed_tokens = r.num_tokens
    r.token_ids.append(3)
    s.add(r)
    return r


def drain(s: Scheduler, max_steps: int = 500) -> list[str]:
    """Run steps, finishing each request at its max_tokens, until none is left; returns the
    finishing order. Fails when that takes more than `max_steps` steps (no progress)."""
    finished: list[str] = []
    for _ in range(max_steps):
        if not s.running and not s.waiting:
            assert s.block_manager.usage().num_used == 0
            return finished
        run(s)
        for r in list(s.running):
            if r.num_output_tokens >= r.sampling.max_tokens:
                s.finish(r)
                finished.append(r.request_id)
    raise AssertionError(f"stuck: running={s.running} waiting={s.waiting} free={s.block_manager.num_free_blocks}")


def test_a_preempted_request_takes_its_blocks_back_from_newer_adopted_ones():
    # The decode pool deadlock, small: two local requests and two adopted ones fill the pool;
    # the older local request grows, preempts the newer, and later needs blocks that only
    # the adopted requests (waiting behind the preempted one) hold.
    s = make(num_blocks=7, budget=64, max_num_seqs=8)
    s.add(finite("old", 8, max_tokens=20))
    s.add(finite("new", 8, max_tokens=20, start=100))
    run(s)  # both prefilled: 2 blocks each
    adopt(s, "adopted-1", 7, max_tokens=20, start=200)  # 2 blocks
    adopt(s, "adopted-2", 3, max_tokens=20, start=300)  # 1 block
    assert s.block_manager.num_free_blocks == 0
    finished = drain(s)
    assert sorted(finished) == ["adopted-1", "adopted-2", "new", "old"]
    assert finished[0] == "old"  # the oldest is never the one that yields


def test_the_oldest_waiting_request_is_never_overtaken_and_takes_blocks_from_newer_waiting_ones():
    s = make(num_blocks=6, budget=64, max_num_seqs=8)
    s.add(finite("head", 12, max_tokens=2))  # the oldest; needs 3 blocks
    a = adopt(s, "adopted", 15, max_tokens=2, start=100)  # newer, holds 4 blocks: 2 are free
    output = s.schedule()  # head (older) needs 3 > 2 free: adopted (newer) gives its blocks
    assert [r.request_id for r in output.preempted] == ["adopted"] and a.block_ids == []
    assert scheduled(output) == [("head", 12)]


def test_a_request_waits_rather_than_throw_away_newer_kv_that_would_not_be_enough():
    s = make(num_blocks=6, budget=64)
    big = finite("big", 20, max_tokens=2)  # needs 5 blocks
    s.add(big)
    adopt(s, "adopted", 3, max_tokens=2, start=100)  # newer, holds 1 block
    held = s.block_manager.reserve(2)  # blocks outside the scheduler (a reservation): 3 free
    output = s.schedule()
    assert output.chunks == [] and output.preempted == []  # 3 free + 1 reclaimable < 5: nothing discarded
    s.block_manager.free(held)
    assert scheduled(s.schedule())[0] == ("big", 20)


def test_blocks_needed_counts_what_queued_requests_need_next():
    s = make(num_blocks=16, budget=64)
    s.add(finite("decoding", 8, max_tokens=20))
    run(s)  # 8 prompt tokens + 1 sampled: its next step needs a third block
    adopt(s, "adopted", 5, max_tokens=20, start=100)  # 6 tokens in 2 blocks: nothing more next step
    s.add(finite("queued", 9, max_tokens=20, start=200))  # holds nothing yet: all 3 of its blocks
    assert s.num_blocks_needed() == 1 + 0 + 3


class _Arrival(NamedTuple):
    step: int
    num_prompt: int
    max_tokens: int
    remote: bool  # prefilled elsewhere: reserve, land after `delay` steps, then adopt
    delay: int


@st.composite
def _decode_loads(draw):
    max_model_len = draw(st.integers(8, 40))
    num_blocks = draw(st.integers(-(-max_model_len // BS), 24))
    arrivals = []
    for _ in range(draw(st.integers(1, 25))):
        num_prompt = draw(st.integers(1, max_model_len - 1))
        arrivals.append(
            _Arrival(
                draw(st.integers(0, 30)),
                num_prompt,
                draw(st.integers(1, max_model_len - num_prompt)),
                draw(st.booleans()),
                draw(st.integers(0, 3)),
            )
        )
    return (
        num_blocks,
        max_model_len,
        draw(st.integers(1, 8)),
        draw(st.sampled_from([4, 16, 64])),
        draw(st.booleans()),
        arrivals,
    )


@settings(max_examples=80, deadline=None)
@given(_decode_loads())
def test_any_load_of_local_and_adopted_requests_drains_with_every_block_back(load):
    """A decode instance as a whole: requests prefilled here and requests whose KV arrives
    into reservations (which take only `spare_blocks`, like `Engine.reserve`), in any mix,
    pool size and arrival order, all finish, and the pool ends empty."""
    num_blocks, max_model_len, max_num_seqs, budget, caching, arrivals = load
    s = make(
        num_blocks=num_blocks, budget=budget, max_num_seqs=max_num_seqs, max_model_len=max_model_len, caching=caching
    )
    bm = s.block_manager
    to_reserve = sorted(range(len(arrivals)), key=lambda i: arrivals[i].step)
    landing: list[tuple[int, int, Request]] = []  # (step it lands, index, request holding reserved blocks)
    live: set[int] = set()
    finished = 0
    for step in range(2000):
        for i in [i for i in to_reserve if arrivals[i].step <= step]:
            a = arrivals[i]
            r = finite(f"r{i}", a.num_prompt, a.max_tokens, start=(i % 3) * 50)  # some prompts share prefixes
            if not a.remote:
                s.add(r)
            elif bm.num_new_blocks_for(r.token_ids) <= s.spare_blocks():
                r.block_ids, _ = bm.allocate(r.token_ids)
                landing.append((step + a.delay, i, r))
            else:
                continue  # busy: the router asks again later
            to_reserve.remove(i)
            live.add(i)
        for entry in [e for e in landing if e[0] <= step]:
            landing.remove(entry)
            r = entry[2]
            bm.register_computed(r.block_ids, r.token_ids, r.num_tokens)
            r.num_computed_tokens = r.num_tokens
            r.token_ids.append(3)
            s.add(r)
        run(s)
        for r in list(s.running):
            if r.num_output_tokens >= r.sampling.max_tokens or r.num_tokens >= max_model_len:
                s.finish(r)
                finished += 1
        if finished == len(arrivals):
            break
    assert finished == len(arrivals), f"stuck: running={s.running} waiting={s.waiting} free={bm.num_free_blocks}"
    assert bm.usage().num_used == 0


def test_running_requests_count_as_prefilling_until_their_whole_prompt_is_computed():
    s = make(budget=16)
    s.add(request("a", 30))  # three chunks of prompt under a 16-token budget
    assert s.num_prefilling() == 0  # waiting, not running
    run(s)
    assert len(s.running) == 1 and s.num_prefilling() == 1
    run(s)
    assert s.num_prefilling() == 0  # its last chunk ran and sampled: it decodes now
    assert len(s.running) == 1
