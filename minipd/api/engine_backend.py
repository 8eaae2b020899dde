"""`ServingBackend` over one colocated engine (`minipd --role both --port P`).

Admission by KV capacity (engine/kv_admission.py): a request is refused with NoCapacity
(503) while the engine's live requests claim `kv_admission_ratio` times its pool already.
"""

from __future__ import annotations

from typing import Callable

from minipd.api.backend import InstanceStats, OutputStream
from minipd.control.role import Role
from minipd.engine.checked_prompt import CheckedPrompt
from minipd.engine.engine import Engine
from minipd.engine.kv_admission import DEFAULT_KV_ADMISSION_RATIO, claim_limit, validate_ratio
from minipd.engine.unavailable import BackendUnavailableError
from minipd.tracing.exporter import tracer
from minipd.tracing.traced_stream import traced_stream

NOT_RUNNING_RETRY_AFTER_S = 1  # an engine that is not running yet is usually starting up


class EngineBackend:
    """`ServingBackend` over one colocated engine (`--role both`), on the engine's loop."""

    def __init__(
        self,
        engine: Engine,
        model_name: str,
        instance_name: str = "local",
        kv_admission_ratio: float | None = DEFAULT_KV_ADMISSION_RATIO,
    ):
        validate_ratio(kv_admission_ratio)
        self.engine = engine
        self.kv_limit_blocks = claim_limit(kv_admission_ratio, engine.config.num_blocks)
        self.model_name = model_name
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.config.scheduler.max_model_len
        self.vocab_size = engine.model_config.vocab_size
        self.instance_name = instance_name

    def submit(self, prompt: CheckedPrompt, request_id: str, *, traceparent: str | None = None) -> OutputStream:
        """Traced (this process exports traces), the request's span ends with its stream."""
        if not self.engine.is_running:
            raise BackendUnavailableError("the engine is not running", retry_after_s=NOT_RUNNING_RETRY_AFTER_S)
        stream = self.engine.submit(prompt, None, request_id, kv_limit_blocks=self.kv_limit_blocks)
        if tracer() is None:
            return stream
        return traced_stream(stream, traceparent, self.instance_name, len(prompt.token_ids))

    async def ready(self) -> bool:
        return self.engine.is_running

    def num_waiting(self) -> int:
        return self.engine.stats().num_waiting

    def instance_stats(self) -> list[InstanceStats]:
        return [InstanceStats(self.instance_name, Role.BOTH, self.engine.stats())]

    def on_transfer_failure(self, callback: Callable[[str], None]) -> None:
        """One engine moves no KV between instances: nothing ever fails."""
