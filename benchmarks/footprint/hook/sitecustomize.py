"""Line recorder for `bench.py footprint`, loaded into every process of a cluster through
PYTHONPATH (Python imports `sitecustomize` at start-up). It traces every thread from the start
but records lines only between SIGUSR1 and SIGUSR2, then writes what it saw to
$MINIPD_FOOTPRINT_DIR/<pid>.json: {"argv", "lines": {file: [line, ...]}}. Only files under
$MINIPD_FOOTPRINT_ROOT are kept. Not part of minipd: a measuring instrument."""

import json
import os
import signal
import sys
import threading

_DIR = os.environ.get("MINIPD_FOOTPRINT_DIR")
_ROOT = os.environ.get("MINIPD_FOOTPRINT_ROOT", "")
_recording = False
_hits: dict[str, set[int]] = {}
_skip: dict[str, bool] = {}


def _ours(filename: str) -> bool:
    known = _skip.get(filename)
    if known is None:
        known = _skip[filename] = not (
            filename.startswith(_ROOT) and "/.venv/" not in filename and filename != __file__
        )
    return not known


def _local(frame, event, arg):
    if _recording and event == "line":
        _hits.setdefault(frame.f_code.co_filename, set()).add(frame.f_lineno)
    return _local


def _global(frame, event, arg):
    # a coroutine's every resume is a "call": frames that began before recording are seen too
    if not _recording or not _ours(frame.f_code.co_filename):
        return None
    _hits.setdefault(frame.f_code.co_filename, set()).add(frame.f_lineno)
    return _local


def _start(signum, stack) -> None:
    global _recording
    _hits.clear()
    _recording = True
    open(os.path.join(_DIR, f"{os.getpid()}.recording"), "w").close()  # tells the bench it started


def _stop(signum, stack) -> None:
    global _recording
    _recording = False
    path = os.path.join(_DIR, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"argv": sys.argv, "lines": {k: sorted(v) for k, v in _hits.items()}}, f)
    os.replace(path + ".tmp", path)


if _DIR:
    sys.settrace(_global)
    threading.settrace(_global)
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
    with open(os.path.join(_DIR, f"{os.getpid()}.pid"), "w") as f:
        f.write(" ".join(sys.argv))
