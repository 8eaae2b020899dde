"""Named fault points: tests pause a process, or one coroutine, at a chosen stage of a request.

A leaf module (it imports nothing of minipd). It lives in the lowest layer, transports, so that
the transports and everything above them that reaches these stages may call it.
Points are off unless armed, and cost one dictionary lookup when off. Two ways to arm one:

- across processes: the test harness starts processes with `MINIPD_FAULT_DIR` naming a
  directory, and arms point NAME by writing the file DIR/NAME with the action in it. The first
  process to reach the point claims the file (an atomic rename), so each arming fires once;
- in this process: `arm(name, action)`.

A point that fires prints `FAULT NAME DETAIL` on standard output (flushed; `announce` may be
replaced, e.g. by a test peer that reports over a pipe), then acts:

- `stop`: the process sends itself SIGSTOP, frozen exactly there; the test then kills it
  (SIGKILL works on a stopped process) or resumes it with SIGCONT;
- `stall SECONDS` (async points only): just that coroutine waits, the rest of the process
  keeps running (heartbeats included): a stalled link, not a frozen process;
- `stall` with no seconds (in-process only): waits until `release(name)`.

The points, in a request's order:

    decode.reserved     a decode instance has answered Reserve (prefill not started)
    prefill.computing   a prefill instance computed a prompt's first layer, sent nothing yet
    kv.layer_written    a sender's first layer write of a request completed
    kv.mid_payload      a sender is half way through a payload (tcp: half a frame's payload is
                        on the wire; ucx: the receiver posted its receives, no payload sent;
                        nixl and loopback: between two layer writes)
    kv.partly_landed    a receiver saw the first bytes of a request land, not all of them
    decode.streaming    a decode instance forwarded a request's second output
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Callable, NamedTuple

ENV_DIR = "MINIPD_FAULT_DIR"
POINTS = (
    "decode.reserved",
    "prefill.computing",
    "kv.layer_written",
    "kv.mid_payload",
    "kv.partly_landed",
    "decode.streaming",
)


class Action(NamedTuple):
    kind: str  # "stop" or "stall"
    seconds: float | None = None  # a stall's length; None: until `release`

    @classmethod
    def parse(cls, text: str) -> "Action":
        words = text.split()
        if words == ["stop"]:
            return cls("stop")
        if words and words[0] == "stall" and len(words) <= 2:
            return cls("stall", float(words[1]) if len(words) == 2 else None)
        raise ValueError(f"fault action: expected 'stop' or 'stall [SECONDS]', got {text!r}")


def _print(name: str, detail: str) -> None:
    print(f"FAULT {name} {detail}".rstrip(), flush=True)


announce: Callable[[str, str], None] = _print
_armed: dict[str, Action] = {}
_releases: dict[str, asyncio.Event] = {}


def armed() -> bool:
    """Whether any point may fire in this process (a site may take a slower path only then)."""
    return bool(_armed) or ENV_DIR in os.environ


def arm(name: str, action: str) -> None:
    """Arm `name` in this process (fires once)."""
    if name not in POINTS:
        raise ValueError(f"fault point: unknown {name!r}; known: {', '.join(POINTS)}")
    _armed[name] = Action.parse(action)
    _releases.pop(name, None)


def release(name: str) -> None:
    """End an in-process `stall` without seconds at `name` (or let it pass at once if not yet reached)."""
    _releases.setdefault(name, asyncio.Event()).set()


def write_armed(directory: str, name: str, action: str) -> None:
    """Arm `name` for the processes started with `MINIPD_FAULT_DIR=directory` (fires once)."""
    if name not in POINTS:
        raise ValueError(f"fault point: unknown {name!r}; known: {', '.join(POINTS)}")
    Action.parse(action)
    staged = os.path.join(directory, f".{name}.staged")
    with open(staged, "w") as f:
        f.write(action)
    os.replace(staged, os.path.join(directory, name))  # appears whole or not at all


def clear_armed(directory: str) -> list[str]:
    """Disarm every point still armed in `directory`; returns their names."""
    names = [name for name in os.listdir(directory) if name in POINTS]
    for name in names:
        try:
            os.remove(os.path.join(directory, name))
        except FileNotFoundError:  # claimed meanwhile
            names.remove(name)
    return names


def _claim(name: str) -> Action | None:
    action = _armed.pop(name, None)
    if action is not None:
        return action
    directory = os.environ.get(ENV_DIR)
    if not directory:
        return None
    path = os.path.join(directory, name)
    claimed = f"{path}.fired-{os.getpid()}"
    try:
        os.rename(path, claimed)
    except OSError:
        return None
    with open(claimed) as f:
        return Action.parse(f.read())


def hit(name: str, detail: str = "") -> None:
    """A synchronous point: fires a `stop` (a stall armed here is refused, naming the point)."""
    if not armed():
        return
    action = _claim(name)
    if action is None:
        return
    if action.kind != "stop":
        raise ValueError(f"fault point {name!r} is synchronous: it can only stop the process")
    _fire(name, detail)


async def reached(name: str, detail: str = "") -> None:
    """An asynchronous point: fires a `stop`, or stalls the calling coroutine."""
    if not armed():
        return
    action = _claim(name)
    if action is None:
        return
    if action.kind == "stop":
        _fire(name, detail)
        return
    announce(name, detail)
    if action.seconds is not None:
        await asyncio.sleep(action.seconds)  # the injected stall itself
    else:
        await _releases.setdefault(name, asyncio.Event()).wait()


def _fire(name: str, detail: str) -> None:
    announce(name, detail)
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGSTOP)
