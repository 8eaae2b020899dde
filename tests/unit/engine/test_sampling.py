"""Sampling options and stop conditions, through the engine."""

from __future__ import annotations

import pytest
from engine_helpers import complete, complete_all, greedy

from minipd.engine.sampling_params import SamplingParams

PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def engine(make_engine):
    # float32 pinned: the same seed must give the same tokens whatever batch the request is in.
    return make_engine(model="tiny", dtype="float32", num_blocks=128, max_model_len=256, max_num_batched_tokens=64)


def seeded(seed: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=24, temperature=kw.pop("temperature", 1.0), seed=seed, ignore_eos=True, **kw)


def test_same_seed_same_tokens_whatever_the_batch(engine, loop_thread):
    alone = loop_thread.run(complete(engine, PROMPT, seeded(42)))
    others = ["a different prompt", "x" * 70, PROMPT + " and more"]
    in_batch = loop_thread.run(complete_all(engine, [PROMPT] + others, seeded(42)))[0]
    mixed = loop_thread.run(complete_all(engine, others + [PROMPT], seeded(7)))  # other seeds around it
    again = loop_thread.run(complete(engine, PROMPT, seeded(42)))
    assert alone.token_ids == in_batch.token_ids == again.token_ids
    assert mixed[-1].token_ids != alone.token_ids  # a different seed samples differently


def test_sampling_differs_from_greedy_and_top_k_1_is_greedy(engine, loop_thread):
    g = loop_thread.run(complete(engine, PROMPT, greedy(24)))
    sampled = loop_thread.run(complete(engine, PROMPT, seeded(1, temperature=1.5)))
    top1 = loop_thread.run(complete(engine, PROMPT, seeded(1, top_k=1)))
    tiny_p = loop_thread.run(complete(engine, PROMPT, seeded(1, top_p=1e-6)))
    assert sampled.token_ids != g.token_ids
    assert top1.token_ids == g.token_ids
    assert tiny_p.token_ids == g.token_ids


def test_unseeded_requests_get_a_seed(engine):
    request = engine.make_request(PROMPT, SamplingParams(temperature=1.0))
    assert request.sampling.seed is not None


def test_max_tokens_gives_length(engine, loop_thread):
    result = loop_thread.run(complete(engine, PROMPT, greedy(5)))
    assert len(result.token_ids) == 5 and result.finish_reason == "length"


def test_stop_token_ids_end_the_request(engine, loop_thread):
    full = loop_thread.run(complete(engine, PROMPT, greedy(24)))
    stop_at = full.token_ids[5]
    first = full.token_ids.index(stop_at)
    params = SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(stop_at,))
    stopped = loop_thread.run(complete(engine, PROMPT, params))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == full.token_ids[: first + 1]


def test_eos_stops_unless_ignored(engine, loop_thread, monkeypatch):
    full = loop_thread.run(complete(engine, PROMPT, greedy(24)))
    fake_eos = full.token_ids[3]
    # Random weights rarely emit the real EOS id, so declare a token they do emit to be EOS.
    monkeypatch.setattr(engine, "eos_token_ids", engine.eos_token_ids | {fake_eos})
    stopping = loop_thread.run(complete(engine, PROMPT, SamplingParams(max_tokens=24, temperature=0.0)))
    ignoring = loop_thread.run(complete(engine, PROMPT, greedy(24)))
    assert stopping.finish_reason == "stop"
    assert stopping.token_ids == full.token_ids[: full.token_ids.index(fake_eos) + 1]
    assert ignoring.token_ids == full.token_ids


def test_stop_strings_truncate_text(engine, loop_thread):
    words = "hello hello world stop here please"
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    full = loop_thread.run(complete(engine, words, params))
    text = full.text
    assert len(text) > 6, "the model must produce some text for this test"
    stop = text[3:6]
    cut = text.find(stop)
    stopped = loop_thread.run(
        complete(engine, words, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=(stop,)))
    )
    assert stopped.finish_reason == "stop"
    assert stopped.text == text[:cut]
    assert stop not in stopped.text
