"""How a step takes prompts from the head of a FCFS queue, as minipd's scheduler does.

Each returns (chunks as (request, new tokens), total new tokens, sum of q*k) where a chunk of
q new tokens attends to k = tokens already computed + q.
"""

from __future__ import annotations

from collections.abc import Iterable

from minipd.ops.planner.sim_request import SimRequest


def chunked(queue: Iterable[SimRequest], budget: int, slots: int):
    """Prompts from the head, the last one cut to what is left of the budget (chunked
    prefill, as minipd's scheduler runs it on every instance)."""
    chunks, tokens, sum_qk = [], 0, 0.0
    if budget > 0 and slots > 0:
        for request in queue:
            q = min(request.prompt_len - request.prefilled, budget)
            chunks.append((request, q))
            tokens += q
            sum_qk += q * (request.prefilled + q)
            budget -= q
            slots -= 1
            if budget == 0 or slots == 0:
                break
    return chunks, tokens, sum_qk


def whole_prompts(queue: Iterable[SimRequest], budget: int, slots: int):
    """Whole prompts from the head while they fit; the first always runs, alone if it is
    longer than the budget (vLLM's original prefill-first scheduler, `prefill_first`)."""
    chunks, tokens, sum_qk = [], 0, 0.0
    for request in queue:
        n = request.prompt_len
        if len(chunks) >= slots or (chunks and tokens + n > budget):
            break
        chunks.append((request, n))
        tokens += n
        sum_qk += float(n) * n
    return chunks, tokens, sum_qk
