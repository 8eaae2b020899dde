"""The sampler on its own: numerically safe for every temperature and top_p that validation
accepts, and one row's failure stays in that row."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minipd.engine.sampler import SamplingFailed, sample
from minipd.engine.sampling_params import InvalidRequestError, SamplingParams

VOCAB = 64
TINIEST = 5e-324  # the smallest positive double
LARGEST = sys.float_info.max


def logits_row(seed: int) -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 5


def params(**kw) -> SamplingParams:
    p = SamplingParams(seed=kw.pop("seed", 1), **kw)
    p.validate(VOCAB)  # only values the engine accepts
    return p


@pytest.mark.parametrize("temperature", [TINIEST, 1e-308, 1e-46, 1e-38, 1e-30, 1e-8])
def test_a_temperature_near_zero_samples_the_most_likely_token(temperature):
    row = logits_row(0)
    assert sample(row[None], [params(temperature=temperature)], [0]) == [int(row.argmax())]


@pytest.mark.parametrize("top_p", [TINIEST, 1e-46, 1e-45, 1e-38, 1e-6])
def test_a_top_p_near_zero_keeps_only_the_most_likely_token(top_p):
    row = logits_row(1)
    assert sample(row[None], [params(temperature=1.0, top_p=top_p)], [0]) == [int(row.argmax())]


@pytest.mark.parametrize("temperature", [1e30, 1e300, LARGEST])
def test_a_huge_temperature_samples_any_token(temperature):
    row = logits_row(2)
    tokens = {sample(row[None], [params(temperature=temperature, seed=s)], [0])[0] for s in range(200)}
    assert len(tokens) > VOCAB // 2  # nearly uniform


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(-1e6, 1e6) | st.just(-math.inf), min_size=VOCAB, max_size=VOCAB),
    temperature=st.floats(TINIEST, LARGEST),
    top_p=st.floats(TINIEST, 1.0),
    top_k=st.integers(0, 2**63 - 1),
    seed=st.integers(0, 2**63 - 1),
    step=st.integers(0, 10**6),
)
def test_any_accepted_params_and_any_finite_logits_give_a_token_that_survives_the_filters(
    values, temperature, top_p, top_k, seed, step
):
    if all(v == -math.inf for v in values):
        values[0] = 0.0  # the model gives every row at least one finite logit
    row = torch.tensor(values, dtype=torch.float32)
    [token] = sample(row[None], [params(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)], [step])
    assert isinstance(token, int) and 0 <= token < VOCAB
    assert row[token] > -math.inf
    if 0 < top_k < VOCAB:
        assert row[token] >= torch.topk(row, top_k).values[-1]


def test_a_row_of_nan_logits_fails_alone():
    rows = torch.stack([logits_row(3), torch.full((VOCAB,), math.nan), logits_row(4), logits_row(5)])
    ps = [params(temperature=0.0), params(temperature=0.7), params(temperature=0.7), params(temperature=0.0)]
    tokens = sample(rows, ps, [0, 0, 0, 0])
    assert isinstance(tokens[1], SamplingFailed) and "NaN" in str(tokens[1])
    assert tokens[0] == int(rows[0].argmax()) and tokens[3] == int(rows[3].argmax())
    assert tokens[2] == sample(rows[2:3], ps[2:3], [0])[0]  # as if alone


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", math.inf),
        ("temperature", math.nan),
        ("top_p", math.nan),
        ("max_tokens", 2**64),
        ("max_tokens", 10**1000),
        ("top_k", 2**63),
        ("seed", 2**64),
        ("seed", -(10**1000)),
    ],
)
def test_values_the_sampler_or_the_control_plane_cannot_carry_are_refused_naming_the_field(field, value):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**{field: value}).validate(VOCAB)
    assert info.value.field == field and len(str(info.value)) < 200  # a 1000-digit value is not echoed
