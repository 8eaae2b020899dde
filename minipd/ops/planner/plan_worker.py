"""`python -m minipd.ops.planner.plan_worker`: the simulator behind the dashboard's Plan view, as a
child process of the router (which never imports the planner).

Protocol: JSON lines, one request at a time. On stdin, `{"id": N, "op": "plan" | "predict" |
"profiles" | "ping", "args": {...}}`, one line of at most `MAX_LINE_BYTES`; on stdout, one line per
request: `{"id": N, "ok": true, "result": {...}}` or `{"id": N, "ok": false, "error":
{"field": F, "message": M}}` (`field` names the input at fault, or `line` for a line that is
too long or not a JSON request). Never pickle. The worker exits at the end of stdin.
"""

from __future__ import annotations

import json
import os
import sys

MAX_LINE_BYTES = 1 << 20


def _error(request_id, field: str, message: str) -> dict:
    return {"id": request_id, "ok": False, "error": {"field": field, "message": message}}


def answer(line: bytes, ops: dict) -> dict:
    """The answer to one request line."""
    try:
        request = json.loads(line)
    except ValueError:
        return _error(None, "line", "not JSON")
    if not isinstance(request, dict) or not isinstance(request.get("args", {}), dict):
        return _error(None, "line", "expected an object with id, op and args")
    request_id, op = request.get("id"), request.get("op")
    if op not in ops:
        return _error(request_id, "op", f"unknown op {op!r}; one of {sorted(ops)}")
    try:
        return {"id": request_id, "ok": True, "result": ops[op](request.get("args", {}))}
    except (ValueError, KeyError, TypeError) as exc:
        text = str(exc).strip("'\"")
        field = text.split(":", 1)[0].split()[-1] if ":" in text else "args"
        return _error(request_id, field if isinstance(exc, ValueError) else "args", text)


def main() -> int:
    os.nice(10)  # below the router it serves, whatever that runs at
    from minipd.ops.planner import plan_view  # after the nice: imports cost CPU too

    ops = {
        "plan": plan_view.plan_answer,
        "predict": plan_view.predict_answer,
        "profiles": plan_view.profiles_answer,
        "ping": lambda args: {"pid": os.getpid()},
    }
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        line = stdin.readline(MAX_LINE_BYTES + 1)
        if not line:
            return 0
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # the rest of the long line is dropped
                line = stdin.readline(MAX_LINE_BYTES)
            reply = _error(None, "line", f"longer than {MAX_LINE_BYTES} bytes")
        else:
            reply = answer(line, ops)
        try:
            text = json.dumps(reply, allow_nan=False)
        except (ValueError, TypeError):  # a figure that JSON cannot carry: say so rather than send it
            text = json.dumps(_error(reply.get("id"), "result", "the answer holds a value JSON cannot carry"))
        stdout.write(text.encode() + b"\n")
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
