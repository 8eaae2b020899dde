"""A window of the Mooncake conversation trace (shared/traces/README.md), scaled to a small model.

The trace gives each request its arrival (`timestamp`, ms), its output length and its prompt
as `hash_ids`: one id a 512-token block, equal leading ids meaning a shared prefix. The
replay's scaling, stated in every result:

- each hash id becomes `block_tokens` token ids, drawn from a generator seeded by the id alone,
  so equal ids give equal blocks in every run and process, and equal leading ids share a prefix
  token for token;
- a prompt keeps at most its first `max_blocks` hash ids (a prefix of a prefix is a prefix: the
  trace's sharing is kept, its lengths capped to the model's context);
- a prompt ends with `tail_tokens` token ids of its own (seeded by its index in the trace), so
  that no prompt is wholly a prefix of another and its last token is always computed.

`bound_hit_tokens` is what an unbounded cache that has seen every earlier request of the window
reuses: the tokens of each prompt's leading hash ids whose whole prefix came before, in an
earlier request of the window.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Iterator

FIRST_TOKEN = 3  # below it, the tokenizers' special ids


@dataclass(frozen=True)
class TraceRequest:
    """One request of the window: `index` in the trace, `arrival_s` from the window's first
    request (uncompressed), its capped `hash_ids`, and `output_tokens` as the trace gives them."""

    index: int
    arrival_s: float
    hash_ids: tuple[int, ...]
    output_tokens: int


@dataclass(frozen=True)
class Scaling:
    """How hash ids become token ids (the module docstring); the cap on hash ids a prompt is
    `read_window`'s."""

    block_tokens: int
    tail_tokens: int
    vocab: int

    def prompt(self, request: TraceRequest) -> list[int]:
        """`request`'s prompt token ids: a block of `block_tokens` per hash id, then its tail."""
        tokens: list[int] = []
        for hash_id in request.hash_ids:
            tokens += self._block(hash_id)
        rng = random.Random(f"tail-{request.index}")
        return tokens + [rng.randrange(FIRST_TOKEN, self.vocab) for _ in range(self.tail_tokens)]

    def _block(self, hash_id: int) -> list[int]:
        rng = random.Random(f"block-{hash_id}")
        return [rng.randrange(FIRST_TOKEN, self.vocab) for _ in range(self.block_tokens)]


def read_window(path: str, start: int, count: int, max_blocks: int) -> list[TraceRequest]:
    """Requests `start` .. `start + count - 1` of the trace at `path`, hash ids capped at
    `max_blocks`; ValueError if the trace has fewer."""
    window = []
    for index, line in enumerate(_lines(path)):
        if index < start:
            continue
        if len(window) == count:
            break
        row = json.loads(line)
        window.append((index, row["timestamp"] / 1000, tuple(row["hash_ids"][:max_blocks]), row["output_length"]))
    if len(window) < count:
        raise ValueError(f"--window: the trace has {start + len(window)} requests, not {start + count}")
    t0 = window[0][1]
    return [TraceRequest(i, t - t0, ids, out) for i, t, ids, out in window]


def _lines(path: str) -> Iterator[str]:
    with open(path) as f:
        yield from (line for line in f if line.strip())


def bound_hit_blocks(window: list[TraceRequest]) -> list[int]:
    """Per request, how many leading hash ids an unbounded cache holds when it arrives: those
    whose whole prefix an earlier request of the window had. A prefix is named by its chain of
    ids, so a chain, not one id, is what must have been seen."""
    seen: set[tuple[int, ...]] = set()
    hits = []
    for request in window:
        ids = request.hash_ids
        hit = 0
        while hit < len(ids) and ids[: hit + 1] in seen:
            hit += 1
        hits.append(hit)
        seen.update(ids[: n + 1] for n in range(len(ids)))
    return hits
