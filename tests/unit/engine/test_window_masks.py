"""The sliding-window masks let a query at position p see exactly the keys p - window + 1 .. p
(padding keys never, padding query rows key 0), for decode groups and for prefill chunks after
any cached prefix, block-aligned or not."""

from __future__ import annotations

import pytest
import torch

from minipd.engine.window_masks import chunk_window_mask, decode_window_mask


def visible(query_pos: int, key_pos: int, window: int) -> bool:
    return query_pos - window < key_pos <= query_pos


@pytest.mark.parametrize("window", [1, 3, 8, 100])
def test_a_decode_group_sees_the_last_window_keys_of_each_sequence(window: int) -> None:
    lens, block_size = [1, 5, 9, 16], 4
    mask = decode_window_mask(lens, 4, block_size, window, "cpu")
    assert mask.shape == (4, 1, 1, 16)
    for row, n in enumerate(lens):
        expected = [visible(n - 1, k, window) for k in range(16)]
        assert mask[row, 0, 0].tolist() == expected


@pytest.mark.parametrize("window", [1, 3, 8, 100])
@pytest.mark.parametrize(("query_len", "context_len"), [(1, 1), (7, 7), (5, 12), (8, 24), (3, 30)])
def test_a_prefill_chunk_sees_the_last_window_keys_of_each_query(window: int, query_len: int, context_len: int) -> None:
    block_size = 4
    mask = chunk_window_mask(query_len, context_len, block_size, window, "cpu")
    whole_q, whole_k = -(-query_len // block_size) * block_size, -(-context_len // block_size) * block_size
    assert mask.shape == (whole_q, whole_k)
    offset = context_len - query_len
    for q in range(query_len):
        assert mask[q].tolist() == [visible(q + offset, k, window) for k in range(whole_k)]
    assert bool(mask.any(dim=1).all())  # no row fully masked (padding rows see key 0 at least)
    assert torch.equal(mask[:query_len, context_len:], torch.zeros(query_len, whole_k - context_len, dtype=torch.bool))
