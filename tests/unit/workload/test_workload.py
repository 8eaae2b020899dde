"""Workloads: arrival processes have the statistics they claim, named workloads have their
shapes, the same seed gives the same requests, and ShareGPT files are read as vLLM reads them."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from minipd.ops.workload import ArrivalProcess, LengthDist, arrival_times, load_sharegpt, make_workload

N = 20000
RATE = 4.0


def _gaps(process: ArrivalProcess) -> list[float]:
    times = arrival_times(process, N, random.Random(0))
    return [b - a for a, b in zip([0.0] + times, times)]


def test_poisson_gaps_have_mean_and_cv_of_an_exponential() -> None:
    gaps = _gaps(ArrivalProcess.poisson(RATE))
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / RATE, rel=0.03)
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_gaps_keep_the_rate_and_change_the_spread(burstiness: float) -> None:
    gaps = _gaps(ArrivalProcess.gamma(RATE, burstiness))
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / RATE, rel=0.05)
    # a gamma of shape k has coefficient of variation 1/sqrt(k)
    assert statistics.pstdev(gaps) / mean == pytest.approx(burstiness**-0.5, rel=0.08)


def test_fixed_concurrency_has_every_request_due_at_once() -> None:
    assert arrival_times(ArrivalProcess.fixed_concurrency(4), 5, random.Random(0)) == [0.0] * 5


@pytest.mark.parametrize(
    "bad",
    [
        dict(kind="poisson", rate=0.0),
        dict(kind="gamma", rate=1.0, burstiness=0.0),
        dict(kind="concurrency", concurrency=0),
        dict(kind="uniform"),
    ],
)
def test_bad_arrival_processes_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="arrivals"):
        ArrivalProcess(**bad)


def test_length_distributions_parse_sample_within_bounds_and_refuse_nonsense() -> None:
    rng = random.Random(1)
    assert LengthDist.parse("fixed:7").sample(rng) == 7
    uniform = LengthDist.parse("uniform:3:9")
    assert {uniform.sample(rng) for _ in range(500)} == set(range(3, 10))
    clipped = LengthDist.parse("lognormal:100:1.5:20:300")
    samples = [clipped.sample(rng) for _ in range(2000)]
    assert min(samples) == 20 and max(samples) == 300
    assert statistics.median(samples) == pytest.approx(100, rel=0.15)
    for text in ("fixed", "uniform:9:3", "normal:1:2", "fixed:x"):
        with pytest.raises(ValueError, match="length distribution"):
            LengthDist.parse(text)


def test_named_workloads_have_their_shapes_and_are_reproducible() -> None:
    arrivals = ArrivalProcess.poisson(2.0)
    prefill = make_workload("prefill-heavy", 200, arrivals, seed=3)
    decode = make_workload("decode-heavy", 200, arrivals, seed=3)
    assert statistics.fmean(r.prompt_len for r in prefill) > 10 * statistics.fmean(r.output_len for r in prefill)
    assert statistics.fmean(r.output_len for r in decode) > 2 * statistics.fmean(r.prompt_len for r in decode)
    assert make_workload("mixed", 50, arrivals, seed=9) == make_workload("mixed", 50, arrivals, seed=9)
    assert make_workload("mixed", 50, arrivals, seed=9) != make_workload("mixed", 50, arrivals, seed=10)
    times = [r.arrival_s for r in prefill]
    assert times == sorted(times) and times[0] > 0


def test_shift_is_prefill_heavy_then_decode_heavy() -> None:
    specs = make_workload("shift", 100, ArrivalProcess.poisson(1.0), seed=0)
    first, second = specs[:50], specs[50:]
    assert min(r.prompt_len for r in first) > max(r.prompt_len for r in second)
    assert max(r.output_len for r in first) < min(r.output_len for r in second)


def test_overridden_lengths_apply_and_mixed_workloads_refuse_overrides() -> None:
    specs = make_workload("decode-heavy", 20, ArrivalProcess.poisson(1.0), prompt_len=LengthDist.fixed(5))
    assert {r.prompt_len for r in specs} == {5}
    with pytest.raises(ValueError, match="mixed"):
        make_workload("mixed", 5, ArrivalProcess.poisson(1.0), output_len=LengthDist.fixed(5))
    with pytest.raises(ValueError, match="unknown"):
        make_workload("chatty", 5, ArrivalProcess.poisson(1.0))


def test_sharegpt_file_gives_first_human_turn_and_reply_length(tmp_path) -> None:
    conversations = [
        {"conversations": [{"from": "human", "value": "one two three"}, {"from": "gpt", "value": "a b"}]},
        {
            "conversations": [
                {"from": "system", "value": "x"},
                {"from": "human", "value": "four five"},
                {"from": "gpt", "value": "c d e f"},
            ]
        },
        {"conversations": [{"from": "gpt", "value": "no question first"}]},
        {"conversations": [{"from": "human", "value": "too long " * 50}, {"from": "gpt", "value": "ok"}]},
        {"id": "no conversations"},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    specs = load_sharegpt(path, 10, ArrivalProcess.poisson(1.0), lambda s: len(s.split()), max_prompt_len=20)
    assert sorted((r.prompt, r.prompt_len, r.output_len) for r in specs) == [
        ("four five", 2, 4),
        ("one two three", 3, 2),
    ]
    assert len(load_sharegpt(path, 1, ArrivalProcess.poisson(1.0), lambda s: len(s.split()))) == 1
    path.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(ValueError, match="list of conversations"):
        load_sharegpt(path, 1, ArrivalProcess.poisson(1.0), len)
