"""Requests from a ShareGPT-style JSON file: a list of conversations, each
`{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}`.

The first human turn is the prompt; the first assistant turn after it sets the output length
(its token count), as `vllm bench serve --dataset-name sharegpt` does. Conversations without
such a pair, or whose lengths fall outside the limits, are skipped.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable

from minipd.ops.workload.arrivals import ArrivalProcess, arrival_times
from minipd.ops.workload.request_spec import RequestSpec

HUMAN_ROLES = ("human", "user")
ASSISTANT_ROLES = ("gpt", "assistant", "chatgpt", "bing", "bard")


def _first_pair(conversation: list[dict]) -> tuple[str, str] | None:
    for turn, reply in zip(conversation, conversation[1:]):
        if turn.get("from") in HUMAN_ROLES and reply.get("from") in ASSISTANT_ROLES:
            prompt, answer = turn.get("value"), reply.get("value")
            if isinstance(prompt, str) and isinstance(answer, str) and prompt and answer:
                return prompt, answer
    return None


def load_sharegpt(
    path: str | Path,
    num_requests: int,
    arrivals: ArrivalProcess,
    count_tokens: Callable[[str], int],
    seed: int = 0,
    max_prompt_len: int = 1 << 20,
    max_output_len: int = 1 << 20,
) -> list[RequestSpec]:
    """Up to `num_requests` requests drawn (shuffled by `seed`) from the file; raises ValueError
    for a file that is not a list of conversations."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of conversations")
    rng = random.Random(seed)
    order = list(range(len(data)))
    rng.shuffle(order)
    picked: list[tuple[str, int, int]] = []
    for index in order:
        if len(picked) == num_requests:
            break
        entry = data[index]
        conversation = entry.get("conversations") if isinstance(entry, dict) else None
        pair = _first_pair(conversation) if isinstance(conversation, list) else None
        if pair is None:
            continue
        prompt_len, output_len = count_tokens(pair[0]), count_tokens(pair[1])
        if 1 <= prompt_len <= max_prompt_len and 1 <= output_len <= max_output_len:
            picked.append((pair[0], prompt_len, output_len))
    times = arrival_times(arrivals, len(picked), rng)
    return [RequestSpec(t, p_len, o_len, prompt) for t, (prompt, p_len, o_len) in zip(times, picked)]
