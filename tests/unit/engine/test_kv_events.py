"""The block manager's KV events: registering full blocks records them stored, in chain order
with their parent, once; evicting one records it removed; a reset clears; the log wakes its
reader once per batch and, past its bound, drops everything and says so."""

from __future__ import annotations

from minipd.engine.block_manager import BlockManager, chain_hashes
from minipd.engine.kv_events import Cleared, KVEventLog, Removed, Stored

BS = 4


def manager(num_blocks: int = 4) -> tuple[BlockManager, KVEventLog, list[int]]:
    woken: list[int] = []
    bm = BlockManager(num_blocks, BS)
    bm.events = KVEventLog(on_pending=lambda: woken.append(1))
    return bm, bm.events, woken


def test_registered_blocks_are_stored_in_chain_order_once():
    other = list(range(100, 100 + BS))
    bm, log, woken = manager()
    tokens = list(range(2 * BS + 1))
    blocks, _ = bm.allocate(tokens)
    bm.register_computed(blocks, tokens, BS)
    bm.register_computed(blocks, tokens, len(tokens))  # the first block again: not recorded twice
    h = chain_hashes(tokens, BS)
    assert log.take() == (False, [Stored([h[0], h[1]], None)])  # one run: the second follows the first
    assert woken == [1]  # once for the batch
    assert log.take() == (False, [])
    blocks, _ = bm.allocate(other)
    bm.register_computed(blocks, other, BS)
    bm.register_computed([blocks[0]], tokens[:BS] + other, BS)  # already cached: nothing
    assert log.take() == (False, [Stored(chain_hashes(other, BS), None)]) and woken == [1, 1]


def test_eviction_records_removed_and_reset_clears():
    bm, log, woken = manager(num_blocks=2)
    tokens = list(range(2 * BS))
    blocks, _ = bm.allocate(tokens)
    bm.register_computed(blocks, tokens, len(tokens))
    bm.free(blocks)
    log.take()
    taken = bm.reserve(2)  # every free block: the tail was freed first, so it goes first
    h = chain_hashes(tokens, BS)
    assert log.take() == (False, [Removed([h[1], h[0]])])
    bm.free(taken)
    bm.reset()
    assert log.take() == (False, [Cleared()])
    assert len(woken) == 3


def test_past_its_bound_the_log_drops_everything_and_says_so():
    log = KVEventLog(max_pending=3)
    for h in range(5):
        log.stored(h, h - 1 if h else None)
    log.removed(9)
    log.cleared()
    assert log.take() == (True, [])
    log.removed(7)
    assert log.take() == (False, [Removed([7])])
