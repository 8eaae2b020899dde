"""Block runs: the unit a transport moves, and how (src, dst) block pairs coalesce into them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class BlockRun(NamedTuple):
    """`num_blocks` consecutive source blocks starting at `src_start`, landing on consecutive
    destination blocks starting at `dst_start`; one layer's run is one contiguous byte range
    on each side, so it moves as one piece."""

    src_start: int
    dst_start: int
    num_blocks: int


def coalesce_runs(src_block_ids: Sequence[int], dst_block_ids: Sequence[int]) -> list[BlockRun]:
    """Turn a request's block map (src_block_ids[i] -> dst_block_ids[i]) into the fewest runs.

    Pairs are sorted by source block, then merged wherever both the source and the
    destination ids continue the previous pair. The caller computes this once per request
    and passes the same runs to every layer's write. Raises ValueError on a length mismatch
    or a block listed twice on either side (two writes into one block is always a bug).
    """
    if len(src_block_ids) != len(dst_block_ids):
        raise ValueError(f"block map: {len(src_block_ids)} source ids but {len(dst_block_ids)} destination ids")
    if len(set(src_block_ids)) != len(src_block_ids) or len(set(dst_block_ids)) != len(dst_block_ids):
        raise ValueError("block map: a block id appears twice")
    runs: list[BlockRun] = []
    for src, dst in sorted(zip(src_block_ids, dst_block_ids)):
        if runs:
            last = runs[-1]
            if src == last.src_start + last.num_blocks and dst == last.dst_start + last.num_blocks:
                runs[-1] = last._replace(num_blocks=last.num_blocks + 1)
                continue
        runs.append(BlockRun(int(src), int(dst), 1))
    return runs


def split_runs(runs: Sequence[BlockRun], max_blocks: int) -> list[list[BlockRun]]:
    """Group runs, in order, into batches of at most `max_blocks` blocks each, splitting a run
    that is longer than a batch. Backends use it to batch many small runs into one frame
    and to cap the size of one frame."""
    if max_blocks < 1:
        raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
    batches: list[list[BlockRun]] = []
    batch: list[BlockRun] = []
    room = max_blocks
    for run in runs:
        src, dst, left = run
        while left:
            take = min(left, room)
            batch.append(BlockRun(src, dst, take))
            src, dst, left, room = src + take, dst + take, left - take, room - take
            if room == 0:
                batches.append(batch)
                batch, room = [], max_blocks
    if batch:
        batches.append(batch)
    return batches
