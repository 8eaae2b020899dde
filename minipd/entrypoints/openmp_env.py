"""OpenMP threads that sleep when idle instead of spinning: set before torch loads.

torch's CPU build runs its kernels (ATen, MKL, oneDNN) on GNU OpenMP (libgomp). By default
a libgomp thread that runs out of work spins for about 3 ms (300,000 polls) before it
sleeps, and a forward pass starts a parallel region every few microseconds, so the team
never sleeps while an engine runs: its threads hold their cores against the engine's own
event loop, the other instances of a local cluster and any unrelated process, and a thread
descheduled in the middle of a region makes the rest spin until it returns.
`OMP_WAIT_POLICY=PASSIVE` makes idle threads sleep at once (libgomp then uses a spin count
of 0); measured here, the CPU burnt by an idle team falls from ~3 ms per region end to 0.
(`KMP_BLOCKTIME` is Intel OpenMP's knob and does nothing to libgomp.)

libgomp reads its environment once, when it is loaded with torch, so the policy must be in
the environment before the first `import torch`: the `minipd` command sets it first thing
(`cli.py` imports nothing that loads torch before), and the cluster launcher puts it in
every child's environment. A value the user set already is kept.
This module must not import torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

PASSIVE_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
_set_too_late = False  # this process set the policy after torch had loaded


def passive_env(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """`env` with the passive wait policy added where the user set none; returns `env`."""
    for name, value in PASSIVE_ENV.items():
        env.setdefault(name, value)
    return env


def prefer_passive_waiting() -> bool:
    """Set the policy in this process's environment; False when torch is loaded already (so
    it no longer takes effect here, though child processes still inherit it)."""
    global _set_too_late
    if "OMP_WAIT_POLICY" not in os.environ and "torch" in sys.modules:
        _set_too_late = True
    passive_env(os.environ)
    return not _set_too_late


def describe() -> str:
    """What this process's OpenMP threads do when idle, for the start-up placement line."""
    policy = os.environ.get("OMP_WAIT_POLICY")
    if policy is None:
        return "idle OpenMP threads spin (OMP_WAIT_POLICY unset)"
    if _set_too_late:
        return f"OMP_WAIT_POLICY={policy} (set after torch loaded: not in effect here)"
    return f"OMP_WAIT_POLICY={policy}"
