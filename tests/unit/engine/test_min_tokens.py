"""`min_tokens`: stop tokens are masked, and stop strings not looked for, until a request has
that many output tokens; on the sampler alone and through the engine."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import complete

from minipd.engine.min_tokens import stops_active, suppress_stop_tokens
from minipd.engine.sampler import sample
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams

VOCAB = 32
EOS = 5
PROMPT = "The quick brown fox jumps over the lazy dog"


def eos_favoured_logits(rows: int) -> torch.Tensor:
    logits = torch.zeros(rows, VOCAB)
    logits[:, EOS] = 100.0  # EOS would win every draw
    logits[:, 7] = 50.0  # a stop token id, second best
    logits[:, 9] = 10.0
    return logits


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_eos_and_stop_token_ids_are_never_drawn_below_min_tokens(temperature):
    p = SamplingParams(max_tokens=8, min_tokens=3, temperature=temperature, seed=1, stop_token_ids=(7,))
    steps = [0, 2, 3]
    logits = eos_favoured_logits(len(steps))
    tokens = sample(suppress_stop_tokens(logits, [p] * 3, steps, {EOS}), [p] * 3, steps)
    assert tokens[0] == tokens[1] == 9  # below min_tokens: neither EOS nor the stop id
    assert tokens[2] == EOS  # min_tokens reached: EOS may end it again
    assert logits[0, EOS] == 100.0  # the input is left untouched


def test_ignore_eos_leaves_eos_alone_and_no_min_tokens_returns_the_same_tensor():
    logits = eos_favoured_logits(1)
    ignoring = SamplingParams(max_tokens=8, min_tokens=3, temperature=0.0, ignore_eos=True)
    assert sample(suppress_stop_tokens(logits, [ignoring], [0], {EOS}), [ignoring], [0]) == [EOS]
    plain = SamplingParams(max_tokens=8, temperature=0.0)
    assert suppress_stop_tokens(logits, [plain], [0], {EOS}) is logits


def test_stop_strings_wait_for_min_tokens():
    p = SamplingParams(max_tokens=8, min_tokens=3)
    assert [stops_active(p, n) for n in (1, 2, 3, 4)] == [False, False, True, True]


@pytest.mark.parametrize("value", [-1, 9])
def test_a_bad_min_tokens_is_refused_naming_it(value):
    with pytest.raises(InvalidRequestError) as exc:
        SamplingParams(max_tokens=8, min_tokens=value).validate(VOCAB)
    assert exc.value.field == "min_tokens"


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(model="tiny", dtype="float32", num_blocks=64, max_model_len=256, max_num_batched_tokens=64)


def test_the_engine_holds_back_eos_and_stop_tokens_until_min_tokens(engine, loop_thread, monkeypatch):
    full = loop_thread.run(complete(engine, PROMPT, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)))
    fake_eos, stop_id = full.token_ids[1], full.token_ids[2]
    # Random weights rarely emit the real EOS id, so declare tokens they do emit to be EOS.
    monkeypatch.setattr(engine, "eos_token_ids", engine.eos_token_ids | {fake_eos})
    monkeypatch.setattr(engine.runner, "eos_token_ids", engine.eos_token_ids)
    plain = SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(stop_id,))
    stopped = loop_thread.run(complete(engine, PROMPT, plain))
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) <= 3
    held = loop_thread.run(
        complete(
            engine, PROMPT, SamplingParams(max_tokens=24, temperature=0.0, min_tokens=10, stop_token_ids=(stop_id,))
        )
    )
    assert len(held.token_ids) >= 10
    assert not {fake_eos, stop_id} & set(held.token_ids[:10])
