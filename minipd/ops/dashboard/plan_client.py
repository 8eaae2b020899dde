"""The router's side of the plan worker (`python -m minipd.ops.planner.plan_worker`), which runs the
simulator for the dashboard's Plan view and live prediction out of the router's process.

- started lazily, on the first call; placed like the router (it inherits the router's CPU set,
  so never a serving instance's cores), niced 10 below it, with one thread for numpy;
- one request at a time (a lock), JSON lines both ways, each line capped (`MAX_LINE_BYTES`),
  an answer awaited at most `timeout_s`: a worker that overruns it, sends a line too long or
  not JSON, or exits is killed, the call fails with `PlanWorkerError`, and the next call
  starts a fresh one;
- answers are cached by their request (`cache_size` of them), so a slider moved back answers
  at once;
- `close()` stops it (the router's shutdown).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import OrderedDict

from minipd.engine.cpu_placement import available_cpus, format_cpu_list

MAX_LINE_BYTES = 1 << 20  # as plan_worker.MAX_LINE_BYTES
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_CACHE_SIZE = 256
WORKER_MODULE = "minipd.ops.planner.plan_worker"
WORKER_NICE = 10
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class PlanWorkerError(Exception):
    """The worker gave no answer (it died, overran its time or broke the protocol)."""


class PlanInputError(Exception):
    """The worker refused the request's input: `field` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class PlanClient:
    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        cache_size: int = DEFAULT_CACHE_SIZE,
        argv: list[str] | None = None,
        announce=lambda line: print(line, file=sys.stderr, flush=True),
    ):
        self.timeout_s, self.cache_size, self.announce = timeout_s, cache_size, announce
        self.argv = argv or [sys.executable, "-m", WORKER_MODULE]
        self.process: asyncio.subprocess.Process | None = None
        self.cache: OrderedDict[str, dict] = OrderedDict()
        self.num_started = 0
        self._lock = asyncio.Lock()
        self._next_id = 0

    async def call(self, op: str, args: dict) -> dict:
        """The worker's result for `op` on `args` (cached by both); PlanInputError when it
        refused an input, PlanWorkerError when it gave no answer."""
        key = json.dumps([op, args], sort_keys=True, allow_nan=False)
        if len(key) > MAX_LINE_BYTES - 100:
            raise PlanInputError("body", f"the request is longer than {MAX_LINE_BYTES - 100} bytes")
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        async with self._lock:
            result = await self._ask(op, args)
        self.cache[key] = result
        if len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return result

    async def _ask(self, op: str, args: dict) -> dict:
        self._next_id += 1
        request_id = self._next_id
        line = json.dumps({"id": request_id, "op": op, "args": args}, allow_nan=False).encode() + b"\n"
        for attempt in (1, 2):  # a worker found dead before it took the request is replaced once
            process = await self._running()
            try:
                process.stdin.write(line)
                await asyncio.wait_for(process.stdin.drain(), self.timeout_s)
            except (ConnectionError, BrokenPipeError):
                await self._kill()
                if attempt == 2:
                    raise PlanWorkerError("the plan worker exited before it took the request") from None
                continue
            except asyncio.CancelledError:
                self._kill_now()
                raise
            except asyncio.TimeoutError:
                await self._kill()
                raise PlanWorkerError(f"the plan worker took no request for {self.timeout_s:g} s (stopped)") from None
            break
        try:
            reply = await asyncio.wait_for(process.stdout.readline(), self.timeout_s)
        except asyncio.CancelledError:  # its answer would be read as the next request's: start afresh
            self._kill_now()
            raise
        except asyncio.TimeoutError:
            await self._kill()
            raise PlanWorkerError(
                f"the plan worker did not answer within {self.timeout_s:g} s (stopped; the next call starts another)"
            ) from None
        except (ValueError, asyncio.LimitOverrunError):  # a line past the stream's limit
            await self._kill()
            raise PlanWorkerError(f"the plan worker sent a line longer than {MAX_LINE_BYTES} bytes") from None
        if not reply:
            code = await self._kill()
            raise PlanWorkerError(f"the plan worker exited (code {code}); the next call starts a new one")
        try:
            answer = json.loads(reply)
            ok, answer_id = answer["ok"], answer["id"]
        except (ValueError, KeyError, TypeError):
            await self._kill()
            raise PlanWorkerError("the plan worker's answer was not a JSON answer line") from None
        if answer_id != request_id and answer_id is not None:
            await self._kill()
            raise PlanWorkerError(f"the plan worker answered request {answer_id}, not {request_id}")
        if not ok:
            error = answer.get("error") or {}
            raise PlanInputError(str(error.get("field", "body")), str(error.get("message", "refused")))
        return answer["result"]

    async def _running(self) -> asyncio.subprocess.Process:
        if self.process is not None and self.process.returncode is None:
            return self.process
        env = {**os.environ, **ONE_THREAD}  # with the router's OMP_WAIT_POLICY (the minipd command sets it)
        self.process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            limit=MAX_LINE_BYTES + 1,
        )
        self.num_started += 1
        cpus = format_cpu_list(available_cpus())
        self.announce(
            f"placement: plan worker: pid {self.process.pid} on CPUs {cpus} (the router's), nice +{WORKER_NICE}"
        )
        return self.process

    def _kill_now(self) -> asyncio.subprocess.Process | None:
        process, self.process = self.process, None
        if process is not None and process.returncode is None:
            try:
                process.kill()
            except ProcessLookupError:  # it exited, and asyncio has not reaped it yet
                pass
        return process

    async def _kill(self) -> int | None:
        process = self._kill_now()
        return None if process is None else await process.wait()

    async def close(self) -> None:
        """Stop the worker: its stdin closed (it exits at the end), killed if it lingers."""
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            try:
                process.stdin.close()
                await asyncio.wait_for(process.wait(), 5.0)
            except (asyncio.TimeoutError, ConnectionError):
                pass
        await self._kill()
