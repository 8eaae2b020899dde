"""`ServingBackend` over one colocated engine (`minipd --role both --port P`)."""

from __future__ import annotations

from typing import Callable, Sequence

from minipd.api.backend import BackendUnavailableError, InstanceStats, OutputStream
from minipd.control.role import Role
from minipd.engine.engine import Engine
from minipd.engine.sampling_params import SamplingParams

NOT_RUNNING_RETRY_AFTER_S = 1  # an engine that is not running yet is usually starting up


class EngineBackend:
    """`ServingBackend` over one colocated engine (`--role both`), on the engine's loop."""

    def __init__(self, engine: Engine, model_name: str, instance_name: str = "local"):
        self.engine = engine
        self.model_name = model_name
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.config.max_model_len
        self.instance_name = instance_name

    def submit(self, prompt: str | Sequence[int], params: SamplingParams, request_id: str) -> OutputStream:
        if not self.engine.is_running:
            raise BackendUnavailableError("the engine is not running", retry_after_s=NOT_RUNNING_RETRY_AFTER_S)
        return self.engine.submit(prompt, params, request_id)

    async def ready(self) -> bool:
        return self.engine.is_running

    def num_waiting(self) -> int:
        return self.engine.stats().num_waiting

    def instance_stats(self) -> list[InstanceStats]:
        return [InstanceStats(self.instance_name, Role.BOTH, self.engine.stats())]

    def on_transfer_failure(self, callback: Callable[[str], None]) -> None:
        """One engine moves no KV between instances: nothing ever fails."""
