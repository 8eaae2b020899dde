"""The crossover model and its measured counterpart, on synthetic numbers (no processes)."""

from __future__ import annotations

import pytest

from benchmarks.loadgen.crossover_model import (
    BITS_PER_BYTE,
    GIGA,
    exposed_transfer_s,
    measured_crossover_gbps,
    model_crossover_gbps,
    model_interference_s,
    stall_s,
)


def simulated_exposed_s(kv_bytes: float, gbps: float, prefill_s: float, num_layers: int) -> float:
    """Layer-wise streaming step by step: layer i's KV is ready when its compute ends and
    queues on the link behind the layers before it."""
    per_layer_s = kv_bytes / num_layers * BITS_PER_BYTE / (gbps * GIGA)
    link_free = 0.0
    for layer in range(num_layers):
        ready = prefill_s * (layer + 1) / num_layers
        link_free = max(link_free, ready) + per_layer_s
    return link_free - prefill_s


@pytest.mark.parametrize("gbps", [100.0, 1.0, 0.2, 0.05, 0.01])
@pytest.mark.parametrize("num_layers", [1, 8, 30])
def test_the_exposed_transfer_formula_matches_a_step_by_step_simulation(gbps, num_layers):
    kv, prefill = 16 * 2**20, 0.5
    assert exposed_transfer_s(kv, gbps, prefill, num_layers) == pytest.approx(
        simulated_exposed_s(kv, gbps, prefill, num_layers)
    )


@pytest.mark.parametrize("interference", [0.001, 0.05, 0.4, 2.0])
def test_the_modelled_crossover_exposes_exactly_the_interference(interference):
    kv, prefill, layers = 12 * 2**20, 0.6, 8
    gbps = model_crossover_gbps(kv, prefill, interference, layers)
    assert exposed_transfer_s(kv, gbps, prefill, layers) == pytest.approx(interference)
    # a slower link exposes more than the interference, a faster one less
    assert exposed_transfer_s(kv, gbps * 0.9, prefill, layers) > interference
    assert exposed_transfer_s(kv, gbps * 1.1, prefill, layers) < interference


def test_modelled_interference_is_the_prefill_less_one_decode_step_per_chunk():
    assert model_interference_s(0.7, 1024, 511, 0.02) == pytest.approx(0.7 - 3 * 0.02)
    assert model_interference_s(0.01, 100, 511, 0.02) == 0.0


def test_stall_counts_only_the_excess_of_gaps_overlapping_the_window():
    times = [i * 0.010 for i in range(10)]  # undisturbed: 10 ms
    times += [times[-1] + 0.100 + i * 0.010 for i in range(10)]  # one 100 ms step
    times += [times[-1] + 0.200] + [times[-1] + 0.200 + i * 0.010 for i in range(1, 5)]  # outside the window
    window_start, window_end = times[9] + 0.001, times[10] - 0.001
    assert stall_s(times, window_start, window_end, 0.010) == pytest.approx(0.090)
    assert stall_s(times, 0.0, times[9], 0.010) == pytest.approx(0.0)


def test_measured_crossover_interpolates_in_transfer_time():
    kv_bits = 0.2  # Gbit: the extra TTFT is kv_bits / B - 0.1 s once the transfer outlasts the overlap
    gbps = [4.0, 1.0, 0.5, 0.25, 0.1]
    extra = [max(0.0, kv_bits / g - 0.1) for g in gbps]
    # the extra TTFT reaches 0.3 s where 0.2 / B = 0.4: B = 0.5, then between 0.5 and 0.25 for 0.5 s
    assert measured_crossover_gbps(gbps, extra, 0.3) == pytest.approx(0.5)
    assert measured_crossover_gbps(gbps, extra, 0.5) == pytest.approx(1 / 3.0)
    assert measured_crossover_gbps(gbps, extra, 5.0) is None  # never reached in the sweep
