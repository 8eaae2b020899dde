"""The built-in load's requests: the workload's own, fitted to the served max_model_len (a
length whose upper bound was not given yields: the documented `lognormal:MEDIAN:SIGMA` works),
and bad input refused naming its field (a distribution whose parameters could overflow
included)."""

from __future__ import annotations

import pytest

from minipd.engine.sampling_params import InvalidRequestError
from minipd.ops.loadgen.builtin_load import LoadRequest, plan_load
from minipd.ops.workload import ArrivalProcess, LengthDist, make_workload


def test_the_requests_are_the_workloads_own():
    body = LoadRequest(workload="decode-heavy", rate=4.0, num_requests=20, seed=3, output_len="fixed:16")
    specs = plan_load(body, max_model_len=1024)
    assert specs == make_workload("decode-heavy", 20, ArrivalProcess.poisson(4.0), 3, None, LengthDist.fixed(16))


def test_default_prompts_longer_than_max_model_len_are_clipped_to_leave_room_for_the_output():
    specs = plan_load(LoadRequest(workload="shift", concurrency=2, num_requests=40), max_model_len=512)
    assert all(s.prompt_len + s.output_len <= 512 for s in specs)
    assert max(s.prompt_len for s in specs) > 400  # the prefill-heavy half stays long
    assert all(s.arrival_s == 0.0 for s in specs)  # a fixed concurrency paces itself


def test_the_documented_open_ended_lognormal_fits_the_model():
    body = LoadRequest(
        workload="decode-heavy",
        rate=2.0,
        num_requests=400,
        prompt_len="lognormal:200:0.8",
        output_len="lognormal:128:1",
    )
    specs = plan_load(body, max_model_len=512)
    assert all(s.prompt_len >= 1 and s.output_len >= 1 and s.prompt_len + s.output_len <= 512 for s in specs)
    assert max(s.output_len for s in specs) > 400  # its tail reaches past half the model: not cut to a fixed share
    prompts = sorted(s.prompt_len for s in specs)
    assert 150 < prompts[len(prompts) // 2] < 260  # the median as asked, the long tail cut


def test_an_open_ended_length_yields_to_a_given_one():
    body = LoadRequest(workload="decode-heavy", rate=2.0, num_requests=50, prompt_len="fixed:1000")
    specs = plan_load(body, max_model_len=1024)  # decode-heavy's own outputs: 128 to 256 tokens
    assert {s.prompt_len for s in specs} == {1000} and max(s.output_len for s in specs) == 24


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"workload": "nope", "rate": 1.0}, "workload"),
        ({"workload": "mixed"}, "rate"),
        ({"workload": "mixed", "rate": 1.0, "concurrency": 1}, "rate"),
        ({"workload": "mixed", "rate": float("inf")}, "rate"),
        ({"workload": "mixed", "concurrency": 1000}, "concurrency"),
        ({"workload": "mixed", "rate": 1.0, "num_requests": 10**6}, "num_requests"),
        ({"workload": "mixed", "rate": 1.0, "duration_s": 0}, "duration_s"),
        ({"workload": "prefill-heavy", "rate": 1.0, "prompt_len": "uniform:9:3"}, "prompt_len"),
        ({"workload": "prefill-heavy", "rate": 1.0, "prompt_len": "fixed:2000"}, "prompt_len"),
        (
            {"workload": "prefill-heavy", "rate": 1.0, "prompt_len": "fixed:800", "output_len": "fixed:300"},
            "prompt_len",
        ),
        ({"workload": "shift", "rate": 1.0, "prompt_len": "fixed:8"}, "prompt_len"),
        ({"workload": "mixed", "rate": 1e-300}, "rate"),
        ({"workload": "decode-heavy", "rate": 1.0, "prompt_len": "lognormal:inf:1:1:100"}, "prompt_len"),
        ({"workload": "decode-heavy", "rate": 1.0, "prompt_len": "lognormal:nan:1"}, "prompt_len"),
        ({"workload": "decode-heavy", "rate": 1.0, "prompt_len": "lognormal:100:1e308:1:100"}, "prompt_len"),
        ({"workload": "decode-heavy", "rate": 1.0, "output_len": "lognormal:100:-1"}, "output_len"),
        ({"workload": "decode-heavy", "rate": 1.0, "output_len": "uniform:1:99999999999"}, "output_len"),
    ],
)
def test_bad_input_names_its_field(fields, field):
    with pytest.raises(InvalidRequestError) as caught:
        plan_load(LoadRequest(**fields), max_model_len=1024)
    assert caught.value.field == field, str(caught.value)
