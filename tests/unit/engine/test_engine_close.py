"""`Engine.close()` while a step runs on the compute thread: the step ends on the requests as they
were scheduled, and only then are they aborted and their blocks freed.

The regression: close applied the aborts first (freeing every request's blocks, emptying its
block list) and then cancelled the loop, whose step kept running on the compute thread over
those requests: the fused decode step refused the now short block tables ("positions [rows] and
block_tables [rows, max_blocks] must be int64"), each chunk run alone then failed preparing its
inputs (IndexError), and a step could write KV into blocks already freed. It showed whenever a
bench with requests in flight was stopped (`bench.py kvtier --trace` on smollm2, stopped).
"""

from __future__ import annotations

import asyncio
import threading

from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.model_runner import StepFailed
from minipd.engine.sampling_params import SamplingParams

GATE_S = 5.0  # how long the held step waits for the loop to stop (a bounded wait, never a race)


def test_close_lets_the_step_in_flight_end_before_it_frees_its_requests(loop_thread):
    engine = Engine(EngineConfig.of(model="tiny", dtype="float32", num_blocks=32, max_model_len=256))
    execute = engine.runner.execute
    entered, loop_stopped = threading.Event(), threading.Event()
    in_step = threading.Event()
    freed_during_step: list[str] = []
    results: list = []

    def held_execute(chunks, hook=None):
        """The first step, held until the loop has stopped (close has begun and cancelled it)."""
        in_step.set()
        try:
            if not entered.is_set():
                entered.set()
                loop_stopped.wait(GATE_S)
            out = execute(chunks, hook)
            results.extend(out)
            return out
        finally:
            in_step.clear()

    engine.runner.execute = held_execute
    finish = engine.scheduler.finish

    def recorded_finish(request, free_blocks=True):
        if in_step.is_set():
            freed_during_step.append(request.request_id)
        return finish(request, free_blocks)

    engine.scheduler.finish = recorded_finish

    async def scenario() -> list:
        await engine.start()
        streams = [
            engine.submit(list(range(3, 3 + 40 + i)), SamplingParams(max_tokens=50, ignore_eos=True)) for i in range(3)
        ]
        engine._loop_task.add_done_callback(lambda _: loop_stopped.set())
        assert await asyncio.to_thread(entered.wait, GATE_S)  # the first step is on the compute thread
        await engine.close()
        outputs = []
        for stream in streams:
            outputs.append([out async for out in stream])
        return outputs

    outputs = loop_thread.run(scenario(), timeout=60)
    assert freed_during_step == []  # nothing freed under the step
    assert results and not any(isinstance(r, (StepFailed, Exception)) for r in results)
    for stream_outputs in outputs:  # every request ended, aborted by the close
        assert stream_outputs[-1].finished and stream_outputs[-1].finish_reason == "abort"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
