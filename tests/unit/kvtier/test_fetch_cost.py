"""Fetch or recompute (kvtier/fetch_cost.py): the choice on both sides of the break-even, the
lines it learns from observations, the probes that keep a decline from being forever."""

from __future__ import annotations

import math

import pytest

from minipd.kvtier.fetch_cost import Always, FetchCost, LinearFit, fetch_choice

BLOCK_BYTES = 1 << 20  # 1 MiB of KV a block
BLOCK_SIZE = 16


def cost(**lines) -> FetchCost:
    """A choice that never probes, from the given prior lines (exact until it observes)."""
    return FetchCost(BLOCK_BYTES, BLOCK_SIZE, probe_every=0, **lines)


def test_a_fit_recovers_the_line_its_observations_lie_on():
    fit = LinearFit(intercept=0.001, slope=2e-5)
    for x in (100, 300, 200, 800, 50, 400) * 10:
        fit.observe(x, 0.002 + 1e-5 * x)
    intercept, slope = fit.line()
    assert intercept == pytest.approx(0.002, rel=0.05) and slope == pytest.approx(1e-5, rel=0.05)


def test_the_prior_holds_until_a_few_observations_then_they_alone_count():
    """A prior far from what is observed (a model 25x faster than assumed) moves nothing once
    the line has its observations, however few and however far from the prior's sizes."""
    fit = LinearFit(intercept=5e-3, slope=0.5e-3)
    for x in (20, 40):
        fit.observe(x, 1e-3 + 2e-5 * x)
    assert fit.line() == (5e-3, 0.5e-3)
    fit.observe(80, 1e-3 + 2e-5 * 80)
    intercept, slope = fit.line()
    assert intercept == pytest.approx(1e-3) and slope == pytest.approx(2e-5)


def test_a_fit_ignores_nonsense_and_keeps_its_slope_positive():
    fit = LinearFit(intercept=0.001, slope=1e-6)
    fit.observe(float("nan"), 1.0)
    fit.observe(0, 1.0)
    fit.observe(100, -1.0)
    assert fit.num_observed == 0
    for x in (100, 1000, 10_000) * 20:  # falling with size: noise, not a price
        fit.observe(x, 1.0 / x)
    intercept, slope = fit.line()
    assert slope > 0 and intercept >= 0


@pytest.mark.parametrize("side", ["below", "above"])
def test_the_choice_fetches_only_past_the_break_even(side):
    # fetch: 3 ms lookup + 5 ms latency + 1 MiB at 1 GiB/s (~1 ms) a block; compute: 0.5 ms a token (8 ms a block)
    c = cost(lookup_s=3e-3, fetch_latency_s=5e-3, fetch_bytes_per_s=float(1 << 30), token_s=0.5e-3)
    lines = c.lines()
    per_block_gain = BLOCK_SIZE * 0.5e-3 - BLOCK_BYTES / float(1 << 30)
    assert lines.break_even_blocks(BLOCK_BYTES, BLOCK_SIZE) == pytest.approx(8e-3 / per_block_gain)
    assert lines.break_even_blocks(BLOCK_BYTES, BLOCK_SIZE, lookup=False) == pytest.approx(5e-3 / per_block_gain)
    # with the lookup: ~1.14 blocks; once the lookup is spent: ~0.71 blocks
    if side == "below":
        assert not c.worth_asking(1)  # 3 + 5 + 1 ms > 8 ms
        assert c.worth_fetching(1)  # 5 + 1 ms < 8 ms
    else:
        assert c.worth_asking(2)  # 3 + 5 + 2 ms < 16 ms
        assert c.worth_fetching(2)


def test_a_store_slower_than_the_engine_is_never_worth_fetching():
    # 1 MiB at 100 MB/s (10.5 ms) a block, against 16 tokens at 0.1 ms (1.6 ms)
    c = cost(fetch_bytes_per_s=100e6, token_s=0.1e-3)
    assert c.lines().break_even_blocks(BLOCK_BYTES, BLOCK_SIZE) == math.inf
    assert not any(c.worth_fetching(n) for n in (1, 8, 64, 1024))
    assert not c.worth_asking(1024)


def test_what_is_observed_moves_the_choice():
    """A store that turns slow (its fetches observed) is declined; an engine that turns out slow
    (its prompt steps observed) makes the same fetch worth it again."""
    c = cost(fetch_latency_s=1e-3, fetch_bytes_per_s=1e9, token_s=0.5e-3)
    assert c.worth_fetching(4)
    for n in (1, 2, 4, 8):  # 50 ms a call, 50 MB/s
        c.observe_fetch(n * BLOCK_BYTES, 0.05 + n * BLOCK_BYTES / 50e6)
    lines = c.lines()
    assert lines.fetch_latency_s == pytest.approx(0.05, rel=0.05)
    assert lines.fetch_bytes_per_s == pytest.approx(50e6, rel=0.05)
    assert not c.worth_fetching(4)  # ~134 ms against 32 ms
    for tokens in (64, 128, 256, 512):  # 20 ms a step and 5 ms a token
        c.observe_step(tokens, 0.02 + tokens * 5e-3)
    assert c.lines().token_s == pytest.approx(5e-3, rel=0.05)
    assert c.worth_fetching(4)  # ~134 ms against 320 ms


def test_a_long_run_of_declines_is_broken_by_a_probe():
    c = FetchCost(BLOCK_BYTES, BLOCK_SIZE, fetch_bytes_per_s=100e6, token_s=0.1e-3, probe_every=4)
    assert [c.worth_fetching(2) for _ in range(8)] == [False, False, False, True] * 2


def test_always_fetches_whatever_there_is_and_the_flag_picks():
    slow = dict(fetch_bytes_per_s=100e6, token_s=0.1e-3)
    assert Always(BLOCK_BYTES, BLOCK_SIZE, **slow).worth_fetching(1)
    assert not Always(BLOCK_BYTES, BLOCK_SIZE, **slow).worth_fetching(0)
    assert type(fetch_choice("always", BLOCK_BYTES, BLOCK_SIZE)) is Always
    assert type(fetch_choice("auto", BLOCK_BYTES, BLOCK_SIZE)) is FetchCost
    with pytest.raises(ValueError, match="kv_tier_fetch"):
        fetch_choice("sometimes", BLOCK_BYTES, BLOCK_SIZE)
