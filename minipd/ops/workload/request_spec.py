"""One request of a workload."""

from __future__ import annotations

from typing import NamedTuple


class RequestSpec(NamedTuple):
    """When a request arrives and how long it is.

    `arrival_s` is the offset from the start of the run (0 for every request of a
    fixed-concurrency run, whose client paces itself). `prompt` is the request's actual prompt
    when the workload came from a file; synthetic workloads leave it None and the client
    builds a prompt of `prompt_len` tokens.
    """

    arrival_s: float
    prompt_len: int
    output_len: int
    prompt: str | None = None
