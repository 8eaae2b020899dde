"""A request's state inside one engine, and what the engine streams back for it."""

from __future__ import annotations

import enum
import time

import msgspec

from minipd.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"  # aborted by the caller, or failed


class TransferInfo(msgspec.Struct):
    """How a disaggregated request's KV moved (set by the router on the final output)."""

    prefill_instance: str
    decode_instance: str
    num_bytes: int
    prefill_cached_tokens: int  # prompt tokens found in the prefill instance's prefix cache
    decode_cached_tokens: int  # prompt tokens the decode instance already held (not sent)
    compute_s: float  # the prefill step
    transfer_s: float  # first write to the last byte acknowledged
    exposed_s: float  # end of prefill compute to the last byte acknowledged
    reserve_s: float = 0.0  # the router's reserve call on the decode instance, busy waits included
    # the decode instance's adopt: from the KV landed and the decode order there (whichever is
    # later) to the sequence queued with its first token; None until the decode side reports it
    adopt_s: float | None = None


OVERLOADED = "overloaded"  # RequestOutput.error_kind of a request the cluster had no room for
# RequestOutput.error_kind of a request an instance failed under: it died, was declared dead or
# went silent past the inter-token timeout; the error names the instance and what happened
INSTANCE_LOST = "instance_lost"


class RequestOutput(msgspec.Struct, kw_only=True):
    """One streamed increment of a request's output."""

    request_id: str
    token_ids: list[int]  # tokens produced since the previous increment
    text: str  # text produced since the previous increment
    finished: bool = False
    finish_reason: str | None = None  # a FinishReason value once finished
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # total so far
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    error: str | None = None  # set when the request failed inside the engine
    # OVERLOADED when it failed for want of capacity (a later retry may succeed), INSTANCE_LOST
    # when an instance it ran on was lost, else None
    error_kind: str | None = None
    queue_time_s: float | None = None  # arrival to first scheduled, once known
    transfer: TransferInfo | None = None  # disaggregated requests, on the final output

    @classmethod
    def aborted(
        cls, request_id: str, error: str | None, num_prompt_tokens: int = 0, error_kind: str | None = None
    ) -> "RequestOutput":
        """The final output of a request that ended without (more) tokens: aborted, or failed
        with `error` (of `error_kind`)."""
        return cls(
            request_id=request_id,
            token_ids=[],
            text="",
            finished=True,
            finish_reason=FinishReason.ABORT.value,
            num_prompt_tokens=num_prompt_tokens,
            error=error,
            error_kind=error_kind,
        )


class Request:
    """Token ids (prompt then output), the blocks holding their KV, and progress counters."""

    def __init__(
        self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams, arrival_time: float | None = None
    ):
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling = sampling
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.status = RequestStatus.WAITING
        self.block_ids: list[int] = []
        self.num_computed_tokens = 0  # leading tokens whose KV is in the pool
        self.num_cached_tokens = 0  # of the prompt, found in the prefix cache
        self.num_preemptions = 0
        self.order = -1  # age rank given by the scheduler when first queued: lower is older
        self.kv_sink = None  # a KVSink when the KV is sent to another instance (kv_sink.py)
        self.compute_times = (0.0, 0.0)  # perf_counter: start of its first step, end of its latest
        self.first_scheduled_time: float | None = None
        # detokenization state
        self.output_text = ""
        self.num_text_sent = 0
        self.num_tokens_sent = 0

    @property
    def queue_time_s(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def is_preemptible(self) -> bool:
        """False while its KV streams to another instance: a transfer may be reading its blocks."""
        return self.kv_sink is None

    def record_step(self, start: float, end: float) -> None:
        self.compute_times = (self.compute_times[0] or start, end)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"status={self.status.value})"
        )
