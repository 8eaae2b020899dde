"""The pool scaling flags of `minipd --role cluster`: a bound not given is the pool's start
size, scaling needs the Ray launcher, and bounds that make no sense are refused naming the
flag's field (the command line exits 2 with it)."""

from __future__ import annotations

import pytest

from minipd.control.role import Role
from minipd.entrypoints.configs import role_configs
from minipd.entrypoints.flags import build_parser
from minipd.policy.pool_scaling import PoolBounds


def cluster_config(*argv: str):
    args = build_parser(Role.CLUSTER).parse_args(["--role", "cluster", *argv])
    return role_configs(Role.CLUSTER, args).cluster


def test_no_scaling_flag_keeps_the_pools_as_started():
    assert cluster_config("--launcher", "ray").scaling() is None


def test_bounds_not_given_are_the_start_sizes_and_the_windows_are_taken():
    scaling = cluster_config(
        "--launcher", "ray", "--num-prefill", "2", "--num-decode", "2", "--max-decode", "4", "--min-prefill", "1",
        "--scale-idle-window-s", "7", "--scale-cooldown-s", "3",
    ).scaling()  # fmt: skip
    assert scaling.bounds == PoolBounds(min_prefill=1, max_prefill=2, min_decode=2, max_decode=4)
    assert (scaling.idle_window_s, scaling.cooldown_s) == (7.0, 3.0)
    assert scaling.bounds.scales


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["--max-decode", "2"], "max_decode: pool scaling needs --launcher ray"),
        (["--scale-cooldown-s", "2"], "scale_cooldown_s: pool scaling needs --launcher ray"),
        (["--launcher", "ray", "--min-decode", "2"], "min_decode: 2 is above --num-decode 1"),
        (["--launcher", "ray", "--num-decode", "3", "--max-decode", "2"], "max_decode: 2 is below --num-decode 3"),
        (["--launcher", "ray", "--min-prefill", "-1"], "min_prefill: must be >= 0"),
        (["--launcher", "ray", "--min-decode", "3", "--max-decode", "2"], "max_decode: must be >= min_decode"),
        (["--launcher", "ray", "--min-decode", "0"], "min_decode: must be >= 1 without colocated instances"),
        (["--launcher", "ray", "--max-decode", "2", "--scale-idle-window-s", "0"], "scale_idle_window_s"),
    ],
)
def test_scaling_flags_that_make_no_sense_are_refused_naming_the_field(argv, problem):
    with pytest.raises(ValueError, match=problem):
        cluster_config(*argv)


def test_a_plain_router_has_no_scaling_flag():
    with pytest.raises(SystemExit):
        build_parser(Role.ROUTER).parse_args(["--role", "router", "--max-decode", "2"])
