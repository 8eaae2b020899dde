"""One request inside the simulator, and where it runs."""

from __future__ import annotations

import enum


class Mode(enum.IntEnum):
    COLOCATED = 0  # prefilled and decoded on one colocated instance
    DISAGGREGATED = 1  # prefilled on a prefill instance, KV sent to decode
    LOCAL = 2  # prefilled on its decode instance (conditional disaggregation)


class SimRequest:
    """Mutable state of one request. The lifecycle, in simulated time:
    1. `arrival_s`: it arrives; it enters the router's admission queue
       `SimOptions.request_overhead_s` later;
    2. admitted: `prompt_len + output_len` tokens of KV reserved on its decode (or colocated)
       instance, which it keeps until it finishes;
    3. prefill, in chunks of at most the token budget, on a prefill instance or locally;
    4. `first_token_s`: the step finishing its prompt ends (local, colocated) or the KV has
       landed on decode (disaggregated), which is when minipd's prefill answers;
    5. `join_step`: the index of the first decode step it rides in on its instance; it then
       rides in every step until it has `output_len` tokens (the first one included);
    6. `finish_s`: its last token; its KV is freed.
    """

    __slots__ = (
        "admitted_s",
        "arrival_s",
        "decode",
        "finish_s",
        "first_token_s",
        "index",
        "join_step",
        "mode",
        "output_len",
        "prefill",
        "prefilled",
        "prompt_len",
        "reported_late",
    )

    def __init__(self, index: int, arrival_s: float, prompt_len: int, output_len: int):
        if prompt_len < 1 or output_len < 1:
            raise ValueError(f"request {index}: prompt_len and output_len must be >= 1, got {prompt_len}, {output_len}")
        self.index = index
        self.arrival_s = arrival_s
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.mode = Mode.COLOCATED
        self.decode = None  # the MixedWorker holding its KV reservation
        self.prefill = None  # the PrefillWorker computing its prompt, if any
        self.prefilled = 0  # prompt tokens computed so far
        self.first_token_s = -1.0
        self.join_step = -1
        self.finish_s = -1.0
        self.admitted_s = -1.0
        self.reported_late = False  # a controller was told it missed its TTFT before its first token

    @property
    def kv_tokens(self) -> int:
        return self.prompt_len + self.output_len
