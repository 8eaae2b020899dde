"""A JSON line per engine step, for fitting latency profiles in the serving path.

`--step-log-dir DIR` (or `EngineConfig.step_log`) makes an engine append one line per step
to its file: `{"t": start, "s": seconds, "q": [new tokens per prefill chunk], "k": [tokens
attended per prefill chunk], "ctx": [context per decode]}`; `t` is `time.perf_counter()`,
CLOCK_MONOTONIC on Linux, which every process of the host shares, so a client can line the
steps up with its own requests. A step is the whole iteration of the engine's loop:
scheduling, the forward pass and the handling of its results, so consecutive steps of a
busy engine tile its time, as the simulator's steps do.
`minipd.ops.planner.step_log_fit` fits DistServe's step-time forms to these lines. The file holds
at most `MAX_LINES` lines (then one warning, and no more), so a long-running instance cannot
fill a disk with it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from minipd.engine.scheduler import ScheduledChunk

log = logging.getLogger(__name__)
MAX_LINES = 1_000_000


class StepLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8", buffering=1)  # line-buffered: readable while it runs
        self._lines = 0

    @staticmethod
    def shape(chunks: Sequence[ScheduledChunk]) -> tuple[list[int], list[int], list[int]]:
        """(q, k, ctx) of a step about to run: taken before it advances its requests. A chunk
        of one new token is a decode, as the model runner counts it."""
        q, k, ctx = [], [], []
        for chunk in chunks:
            done = chunk.request.num_computed_tokens + chunk.num_new_tokens
            if chunk.num_new_tokens == 1:
                ctx.append(done)
            else:
                q.append(chunk.num_new_tokens)
                k.append(done)
        return q, k, ctx

    def record(self, shape: tuple[list[int], list[int], list[int]], start: float, end: float) -> None:
        if self._file is None:
            return
        if self._lines >= MAX_LINES:
            log.warning("step log %s: %d lines written, logging no more", self.path, MAX_LINES)
            self.close()
            return
        q, k, ctx = shape
        line = json.dumps({"t": round(start, 6), "s": round(end - start, 6), "q": q, "k": k, "ctx": ctx})
        self._file.write(line + "\n")
        self._lines += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
