"""Which decode sequences of a step attend together: groups of similar context length.

Batched paged decode gathers each sequence's KV blocks side by side, padded to the longest
context of the batch, then runs one attention over the padded run. With mixed lengths most
of that is padding: at 64 sequences of 32 to 768 tokens, about half the gathered and
attended bytes, and at that batch size attention, not the weights, dominates a CPU decode
step. So the step's decodes are sorted by context length and cut into a few groups, each
padded only to its own longest. A group costs a handful of extra torch calls per layer,
which `GROUP_OVERHEAD_BLOCKS` prices in blocks of padding. Measured here (SmolLM2's KV
shape, bf16, one thread, 64 sequences of 64 to 768 tokens, gather and attention of one
layer): one group 12.8 ms, three 10.2 ms, one per sequence (no padding at all) 9.8 ms; a
block costs ~4.7 us and a group ~30 us, so a cut pays when it saves more than ~6 blocks.
"""

from __future__ import annotations

from typing import Sequence

MAX_GROUPS = 4
GROUP_OVERHEAD_BLOCKS = 8  # a group is worth making when it saves more padded blocks than this


def split_by_length(
    block_counts: Sequence[int], max_groups: int = MAX_GROUPS, overhead_blocks: int = GROUP_OVERHEAD_BLOCKS
) -> list[tuple[int, int]]:
    """Cut `block_counts` (sorted ascending: each decode's context blocks) into at most
    `max_groups` contiguous [start, end) groups, splitting greedily wherever one cut saves
    the most padded blocks, as long as it saves more than `overhead_blocks`."""
    if not block_counts:
        return []
    groups = [(0, len(block_counts))]
    while len(groups) < max_groups:
        best_saving, best = overhead_blocks, None
        for index, (start, end) in enumerate(groups):
            whole = (end - start) * block_counts[end - 1]
            for cut in range(start + 1, end):
                saving = whole - (cut - start) * block_counts[cut - 1] - (end - cut) * block_counts[end - 1]
                if saving > best_saving:
                    best_saving, best = saving, (index, cut)
        if best is None:
            break
        index, cut = best
        start, end = groups[index]
        groups[index : index + 1] = [(start, cut), (cut, end)]
    return groups
