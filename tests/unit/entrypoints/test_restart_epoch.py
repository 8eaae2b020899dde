"""A restarted instance starts at a new role epoch: the launcher's command line for it, and the
guard that starts there."""

from __future__ import annotations

import pytest

from minipd.control.role import Role
from minipd.disagg.role_switch import RoleGuard
from minipd.entrypoints.restart_epoch import EPOCHS_PER_RESTART, restarted_argv

ARGV = ["--instance-id", "decode-0", "--port", "0", "--model", "tiny"]


def test_the_first_restart_adds_a_start_epoch():
    assert restarted_argv(ARGV, 1) == [*ARGV, "--start-epoch", str(EPOCHS_PER_RESTART)]


@pytest.mark.parametrize("earlier", [["--start-epoch", "1000000"], ["--start-epoch=1000000"]])
def test_a_later_restart_replaces_the_earlier_epoch(earlier):
    assert restarted_argv([*ARGV[:2], *earlier, *ARGV[2:]], 2) == [*ARGV, "--start-epoch", str(2 * EPOCHS_PER_RESTART)]


def test_a_guard_starts_at_its_epoch_and_refuses_the_predecessors():
    guard = RoleGuard("decode-0", Role.DECODE, EPOCHS_PER_RESTART)
    assert guard.epoch == EPOCHS_PER_RESTART
    assert guard.refusal(EPOCHS_PER_RESTART) is None
    refused = guard.refusal(3)  # an epoch the old process had reached
    assert refused is not None and "epoch" in refused.message


def test_a_negative_start_epoch_is_refused():
    with pytest.raises(ValueError, match="start_epoch"):
        RoleGuard("decode-0", Role.DECODE, -1)
