"""The role epoch a launcher restarts an instance at.

A restarted instance starts at its restart count times EPOCHS_PER_RESTART: above any epoch its
predecessor reached (one per role switch), so what was sent to the old process under its epoch
is refused as stale, and every router (etcd's watchers too) sees the restart as an epoch change.
"""

from __future__ import annotations

EPOCHS_PER_RESTART = 1_000_000
FLAG = "--start-epoch"


def restarted_argv(argv: list[str], restarts: int) -> list[str]:
    """An instance's command line for its `restarts`-th restart: `--start-epoch` set (replacing
    one an earlier restart had set) to `restarts * EPOCHS_PER_RESTART`."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == FLAG:
            skip = True
        elif not arg.startswith(FLAG + "="):
            kept.append(arg)
    return [*kept, FLAG, str(restarts * EPOCHS_PER_RESTART)]
