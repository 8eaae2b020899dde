"""The plan command end to end (`run(args)`, in process): table, JSON, green-zone PNG, the
size sweep, a re-plan at a thin link, and bad input."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from minipd.ops.planner.__main__ import main as planner_main
from minipd.ops.planner.experiments import plan_command

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BASE = [
    "--builtin",
    "llama3-8b-h100",
    "--num-instances",
    "3",
    "--workload",
    "prefill-heavy",
    "--num-requests",
    "300",
    "--slo",
    "ttft:300",
    "itl:40",
]


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    plan_command.add_arguments(parser)
    return plan_command.run(parser.parse_args(argv))


def _numbers(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    files = {k: out / name for k, name in (("json", "plan.json"), ("plot", "plan.png"), ("sweep", "sizes.png"))}
    rc = _run(
        BASE
        + [
            "--json",
            str(files["json"]),
            "--plot",
            str(files["plot"]),
            "--sweep-sizes",
            "1",
            "2",
            "3",
            "--sweep-link-gbps",
            "400",
            "1",
            "--sweep-plot",
            str(files["sweep"]),
        ]
    )
    assert rc == 0
    return files, json.loads(files["json"].read_text())


def test_plan_writes_every_split_with_finite_figures(planned, capsys) -> None:
    _, data = planned
    plan = data["plan"]
    assert [s["label"] for s in plan["splits"]] == ["colocated x3", "1P:2D", "2P:1D"]
    assert plan["best"] in {s["label"] for s in plan["splits"]}
    best = max(plan["splits"], key=lambda s: s["goodput_rps"])
    assert best["label"] == plan["best"] and best["goodput_rps"] > 0
    assert all(math.isfinite(x) for x in _numbers(data))
    for s in plan["splits"]:
        assert s["eval_rate_rps"] == pytest.approx(plan["eval_rate_rps"])
        assert 0 <= s["eval"]["attainment"] <= 1
        assert s["meets_slo"] == (s["eval"]["attainment"] >= plan["target"])
        assert s["goodput_per_instance"] == pytest.approx(s["goodput_rps"] / 3)
    assert next(s for s in plan["splits"] if s["label"] == plan["best"])["meets_slo"]


def test_plan_draws_pngs(planned) -> None:
    files, _ = planned
    assert files["plot"].read_bytes()[:8] == PNG_MAGIC
    assert files["sweep"].read_bytes()[:8] == PNG_MAGIC


def test_size_sweep_reports_where_splitting_stops_paying(planned) -> None:
    _, data = planned
    sweep = data["size_sweep"]
    assert sweep["sizes"] == [1, 2, 3] and sweep["link_gbps"] == [400.0, 1.0]
    points = {(p["link_gbps"], p["num_instances"]): p for p in sweep["points"]}
    assert len(points) == 6
    for link in (400.0, 1.0):
        one = points[(link, 1)]
        assert one["best_split"] is None and not one["splitting_pays"]  # nothing to split
        for n in (2, 3):
            p = points[(link, n)]
            assert p["splitting_pays"] == (p["best_split_per_instance"] > p["colocated_per_instance"])
    # the colocated figures do not depend on the link; a 1 Gbit/s link cannot beat a 400 one
    for n in (1, 2, 3):
        assert points[(1.0, n)]["colocated_per_instance"] == points[(400.0, n)]["colocated_per_instance"]
        assert points[(1.0, n)]["best_split_per_instance"] <= points[(400.0, n)]["best_split_per_instance"] + 1e-9
    crossover = sweep["colocated_wins_below"]
    assert set(crossover) == {"400 Gbit/s", "1 Gbit/s"}
    for label, link in (("400 Gbit/s", 400.0), ("1 Gbit/s", 1.0)):
        size = crossover[label]
        if size is None:
            assert not points[(link, 3)]["splitting_pays"]
        else:
            assert all(points[(link, n)]["splitting_pays"] for n in (1, 2, 3) if n >= size)
            if size > 1:
                assert not points[(link, size - 1)]["splitting_pays"]


def test_replanning_at_a_thin_link_shows_the_ttft_failure(planned, tmp_path) -> None:
    _, data = planned
    rate = data["plan"]["eval_rate_rps"]
    thin = tmp_path / "thin.json"
    # a 768-token prompt of Llama-3-8B is 100 MB of KV: 0.4 s at 2 Gbit/s, over the 300 ms SLO
    assert _run(BASE + ["--link-gbps", "2", "--rate", str(rate), "--json", str(thin)]) == 0
    fast = {s["label"]: s for s in data["plan"]["splits"]}
    slow = {s["label"]: s for s in json.loads(thin.read_text())["plan"]["splits"]}
    for label in ("1P:2D", "2P:1D"):
        assert slow[label]["eval"]["ttft_s"]["p90"] > 0.3
        assert slow[label]["eval"]["ttft_s"]["p90"] > fast[label]["eval"]["ttft_s"]["p90"] + 0.3
        assert not slow[label]["meets_slo"]
    assert slow["colocated x3"]["eval"] == fast["colocated x3"]["eval"]  # no link, no change


def test_bad_input_exits_2_naming_the_field(capsys) -> None:
    assert _run(BASE[:-3] + ["--slo", "ttft:fast"]) == 2
    assert "ttft:fast" in capsys.readouterr().err
    assert _run(BASE + ["--prompt-len", "zipf:3"]) == 2
    assert "zipf:3" in capsys.readouterr().err
    assert _run(BASE + ["--link-gbps", "0"]) == 2
    assert "link_gbps" in capsys.readouterr().err


def test_python_dash_m_entry_runs_plan_by_default(tmp_path, capsys) -> None:
    out = tmp_path / "p.json"
    assert (
        planner_main(
            [
                "--builtin",
                "llama3-8b-h100",
                "--num-instances",
                "2",
                "--workload",
                "prefill-heavy",
                "--num-requests",
                "200",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert "winner:" in capsys.readouterr().out
    assert json.loads(out.read_text())["plan"]["num_instances"] == 2
