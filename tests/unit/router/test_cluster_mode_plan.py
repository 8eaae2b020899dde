"""Which instance takes which role, in what order, to flip a cluster to colocated or a split."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minipd.control.role import Role
from minipd.engine.sampling_params import InvalidRequestError
from minipd.ops.control_loop.cluster_mode import plan_mode


def handles(**roles: str) -> list:
    return [SimpleNamespace(instance_id=name, role=Role(role)) for name, role in roles.items()]


def test_colocated_moves_every_instance_not_both_yet():
    assert plan_mode(handles(a="prefill", b="decode", c="both"), "colocated", None) == [
        ("a", Role.BOTH),
        ("b", Role.BOTH),
    ]


def test_a_split_switches_into_decode_first_so_decode_is_never_left_empty():
    plan = plan_mode(handles(a="decode", b="decode", c="decode"), "split", 2)
    assert plan == [("a", Role.PREFILL), ("b", Role.PREFILL)]
    plan = plan_mode(handles(a="prefill", b="prefill", c="decode"), "split", 1)
    assert plan == [("b", Role.DECODE)]  # a stays prefill; b into decode
    plan = plan_mode(handles(a="both", b="both", c="both"), "split", 1)
    assert plan == [("b", Role.DECODE), ("c", Role.DECODE), ("a", Role.PREFILL)]


def test_a_split_after_colocated_restores_the_roles_from_before():
    before = {"a": Role.DECODE, "b": Role.PREFILL}
    plan = plan_mode(handles(a="both", b="both"), "split", 1, before)
    assert plan == [("a", Role.DECODE), ("b", Role.PREFILL)]


def test_nothing_to_do_is_an_empty_plan():
    assert plan_mode(handles(a="both"), "colocated", None) == []
    assert plan_mode(handles(a="prefill", b="decode"), "split", 1) == []


@pytest.mark.parametrize(
    "mode, prefill, field, words",
    [
        ("mixed", None, "mode", ["'mixed'", "colocated, split"]),
        ("split", None, "prefill", ["needs the number"]),
        ("split", 0, "prefill", ["1 to 2 of 3", "got 0"]),
        ("split", 3, "prefill", ["1 to 2 of 3", "got 3"]),
        ("split", True, "prefill", ["got True"]),
        ("colocated", 1, "prefill", ["only a split"]),
    ],
)
def test_a_mode_or_split_that_cannot_be_names_its_field(mode, prefill, field, words):
    with pytest.raises(InvalidRequestError) as caught:
        plan_mode(handles(a="prefill", b="decode", c="decode"), mode, prefill)
    assert caught.value.field == field and all(w in str(caught.value) for w in words), str(caught.value)
