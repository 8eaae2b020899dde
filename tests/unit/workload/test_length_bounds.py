"""Length distributions cannot overflow: any text either parses into a distribution whose
mean is finite and whose draws stay in [low, high] ⊆ [1, MAX_TOKENS], or is refused with a
ValueError naming it (never another exception). Extreme parameters (inf, nan, 1e308, a sigma
beyond MAX_SIGMA, lengths beyond MAX_TOKENS) are refused; the widest sigma allowed draws
without overflow."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipd.ops.workload.lengths import MAX_SIGMA, MAX_TOKENS, LengthDist, open_ended

NUMBERS = ["inf", "-inf", "nan", "1e308", "-1e308", "1e-300", "5e-324", "0", "-0", "-1", "0.5", "1", "7", "100"]
NUMBERS += ["2048", str(MAX_TOKENS), str(MAX_TOKENS + 1), str(2**64), "9" * 30, "", "x", "1_000", " 5"]
number_texts = st.sampled_from(NUMBERS) | st.integers(-(2**70), 2**70).map(str) | st.floats().map(repr)
dist_texts = st.builds(
    lambda kind, fields: ":".join([kind, *fields]),
    st.sampled_from(["fixed", "uniform", "lognormal", "normal", ""]),
    st.lists(number_texts, max_size=5),
) | st.text(max_size=30)


@settings(max_examples=500, deadline=None, database=None)
@given(dist_texts, st.integers(0, 2**32))
def test_any_text_parses_into_a_bounded_distribution_or_is_refused(text, seed):
    try:
        dist = LengthDist.parse(text)
    except ValueError as exc:
        assert "length distribution" in str(exc)
        return
    assert 1 <= dist.low <= dist.high <= MAX_TOKENS
    assert math.isfinite(dist.mean)
    rng = random.Random(seed)
    assert all(dist.low <= dist.sample(rng) <= dist.high for _ in range(10))


@pytest.mark.parametrize(
    "text",
    [
        "lognormal:inf:1",
        "lognormal:inf:1:1:100",
        "lognormal:nan:1",
        "lognormal:1e308:1",
        "lognormal:0:1",
        "lognormal:100:1e308:1:100",
        "lognormal:100:nan",
        "lognormal:100:-0.5",
        f"lognormal:100:{MAX_SIGMA + 0.1}",
        f"fixed:{MAX_TOKENS + 1}",
        f"uniform:1:{2**64}",
        f"lognormal:100:1:1:{MAX_TOKENS + 1}",
    ],
)
def test_parameters_that_could_overflow_are_refused(text):
    with pytest.raises(ValueError, match="length distribution"):
        LengthDist.parse(text)


def test_the_widest_sigma_draws_within_its_bounds():
    dist = LengthDist.parse(f"lognormal:{MAX_TOKENS}:{MAX_SIGMA}")
    rng = random.Random(0)
    draws = [dist.sample(rng) for _ in range(5000)]
    assert min(draws) == 1 and max(draws) == MAX_TOKENS
    assert math.isfinite(dist.mean)


def test_only_a_lognormal_without_bounds_is_open_ended():
    assert open_ended("lognormal:200:0.8")
    assert not open_ended("lognormal:200:0.8:1:512") and not open_ended("fixed:8") and not open_ended("uniform:1:2")
