"""`minipd day`'s modes on a short day with quiet hours: every mode's figures, the table, the
JSON and the plot, and what scaling buys (fewer GPU-hours than the fixed cluster)."""

from __future__ import annotations

import json

import msgspec
import pytest

from minipd.ops.planner.experiments.day_command import print_day
from minipd.ops.planner.experiments.day_experiment import DAY_MODES, run_day
from minipd.ops.planner.experiments.day_workload import CHAT, SUMMARISE
from minipd.ops.planner.kv_link import KVLink
from minipd.ops.planner.profiles import builtin_profile
from minipd.policy.pool_scaling import PoolBounds, ScalingConfig
from minipd.policy.ratio_controller import ControllerConfig
from minipd.slo.targets import SLO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# three quiet hours of batch summaries, then two busy hours of chat
HOURS = ((0.4, SUMMARISE), (0.35, SUMMARISE), (0.4, SUMMARISE), (0.7, CHAT), (0.8, CHAT))
NUM_INSTANCES, SECONDS_PER_HOUR = 16, 10.0


def short_day():
    profile = builtin_profile("llama3-70b-h100-tp4")
    slo = SLO.parse(["ttft:1500", "itl:40"])
    return run_day(
        profile,
        num_instances=NUM_INSTANCES,
        seconds_per_hour=SECONDS_PER_HOUR,
        slo=slo,
        link=KVLink(profile.link_gbps, profile.link_setup_s, True, profile.num_layers),
        controller=ControllerConfig(slo=slo, window_s=5.0, cooldown_s=1.0, max_in_flight=4),
        hours=HOURS,
        modes=DAY_MODES,
        scale=ScalingConfig(
            bounds=PoolBounds(min_prefill=1, max_prefill=NUM_INSTANCES, min_decode=1, max_decode=NUM_INSTANCES),
            cooldown_s=1.0,
            idle_window_s=3.0,
        ),
        startup_delay_s=0.5,
    )


@pytest.fixture(scope="module")
def day():
    return short_day()


def test_every_mode_reports_attainment_gpu_hours_and_its_history(day) -> None:
    assert [m.name for m in day.modes] == list(DAY_MODES)
    assert day.gpus_per_instance == 4
    full = NUM_INSTANCES * len(HOURS) * day.gpus_per_instance
    for mode in day.modes:
        assert 0.0 <= mode.attainment <= 1.0
        assert mode.gpu_hours == pytest.approx(mode.instance_hours * 4)
        assert mode.roles[0] == (0.0, day.fixed_prefill, NUM_INSTANCES - day.fixed_prefill, 0, 0, 0)
        assert all(sum(r[1:]) <= NUM_INSTANCES for r in mode.roles)  # never over capacity
        assert len(mode.windows) == len(HOURS) * SECONDS_PER_HOUR / day.window_s
    for name in ("fixed", "switch"):  # a fixed-size cluster holds every instance all day
        assert day.mode(name).gpu_hours == pytest.approx(full)
        assert day.mode(name).num_added == day.mode(name).num_removed == 0
    assert day.mode("fixed").num_moves == 0 and not day.mode("fixed").events
    for h in day.hours:
        assert set(h.attainment) == set(h.prefill) == set(h.held) == set(DAY_MODES)
        assert h.held["fixed"] == pytest.approx(NUM_INSTANCES)


def test_scaling_gives_back_the_quiet_hours_and_grows_again_for_the_busy_ones(day) -> None:
    scale = day.mode("scale")
    full = day.mode("fixed").gpu_hours
    assert scale.num_removed > 0 and scale.num_added > 0
    assert scale.gpu_hours < 0.9 * full
    assert day.mode("both").gpu_hours < 0.9 * full
    quiet, busy = day.hours[2], day.hours[-1]
    assert quiet.held["scale"] < NUM_INSTANCES - 2  # shrunk in the night
    assert busy.held["scale"] > quiet.held["scale"]  # grown back for the chat
    # every add, remove and switch is in the event list, in time order
    assert [e[1] for e in scale.events].count("remove") == scale.num_removed
    assert [e[0] for e in scale.events] == sorted(e[0] for e in scale.events)


def test_the_table_json_and_plot_name_every_mode(day, capsys, tmp_path) -> None:
    print_day(day)
    out = capsys.readouterr().out
    for name in DAY_MODES:
        assert f"  {name:<7} attainment" in out
    assert "scale held" in out and "GPU-hours" in out
    decoded = json.loads(msgspec.json.encode(day))
    assert [m["name"] for m in decoded["modes"]] == list(DAY_MODES)
    assert decoded["modes"][2]["gpu_hours"] == pytest.approx(day.mode("scale").gpu_hours)
    pytest.importorskip("matplotlib")
    from minipd.ops.planner.experiments.plots import day as plot_day

    path = tmp_path / "day.png"
    plot_day(day, str(path))
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_bad_scaling_bounds_are_refused_naming_the_flag(capsys) -> None:
    import argparse

    from minipd.ops.planner.experiments import day_command

    parser = argparse.ArgumentParser()
    day_command.add_arguments(parser)
    args = parser.parse_args(["--modes", "scale", "--min-decode", "3", "--max-decode", "2"])
    assert day_command.run(args) == 2
    assert "max_decode: must be >= min_decode (3), got 2" in capsys.readouterr().err
    args = parser.parse_args(["--modes", "scale", "--idle-window-s", "0"])
    assert day_command.run(args) == 2
    assert "scale_idle_window_s: must be positive, got 0.0" in capsys.readouterr().err
