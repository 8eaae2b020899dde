"""Block keys and the model digest: the same in every process (a fixed derivation, checked against
known values), different whenever what a block's KV means differs."""

from __future__ import annotations

import hashlib
import struct

import msgspec
import pytest

from minipd.control.messages import PROTOCOL_VERSION, Fingerprint
from minipd.disagg.fingerprint import KV_LAYOUT, kv_tier_digest
from minipd.kvtier.keys import block_keys, chain_digests
from minipd.models.arch.model_config import PRESETS

MODEL = bytes(range(16))


def test_keys_are_the_documented_derivation():
    """Pinned values: a change to the derivation must change KEY_PREFIX's version, not silently
    make every stored block unreachable (or, worse, reachable under another meaning)."""
    keys = block_keys(MODEL, list(range(40)), 16)
    assert [k.name for k in keys] == [
        "minipd-kv/v1/000102030405060708090a0b0c0d0e0f/16/27840bcceaf97e9f44b021ca9c010645",
        "minipd-kv/v1/000102030405060708090a0b0c0d0e0f/16/b3c2067565eefdb38a373a8b9c6ac4f1",
    ]  # 40 tokens: two full blocks, the partial third has no key
    first = hashlib.blake2b(bytes(16) + struct.pack("<16q", *range(16)), digest_size=16).digest()
    second = hashlib.blake2b(first + struct.pack("<16q", *range(16, 32)), digest_size=16).digest()
    assert [k.chain for k in keys] == [first, second]


def test_a_key_covers_every_token_before_it():
    tokens = list(range(64))
    changed = [*tokens[:5], 999, *tokens[6:]]  # a token of the first block
    ours, theirs = chain_digests(tokens, 16), chain_digests(changed, 16)
    assert all(a != b for a, b in zip(ours, theirs))
    later = [*tokens[:40], 999, *tokens[41:]]  # a token of the third block
    assert chain_digests(later, 16)[:2] == ours[:2] and chain_digests(later, 16)[2:] != ours[2:]


def test_the_model_and_block_size_are_in_every_key():
    tokens = list(range(64))
    assert {k.name for k in block_keys(MODEL, tokens, 16)}.isdisjoint(block_keys(bytes(16), tokens, 16))
    assert {k.name for k in block_keys(MODEL, tokens, 16)}.isdisjoint({k.name for k in block_keys(MODEL, tokens, 32)})
    with pytest.raises(ValueError, match="16 bytes"):
        block_keys(b"short", tokens, 16)


def _fingerprint(**changes) -> Fingerprint:
    fields = dict(
        protocol_version=PROTOCOL_VERSION,
        model=PRESETS["tiny"],
        weights_digest="ab" * 16,
        dtype="float32",
        block_size=16,
        kv_layout=KV_LAYOUT,
    )
    return Fingerprint(**{**fields, **changes})


@pytest.mark.parametrize(
    "change",
    [
        {"weights_digest": "cd" * 16},
        {"dtype": "bfloat16"},
        {"block_size": 32},
        {"kv_layout": "blocks,layers"},
        {"weights": "quantized"},
        {"quantized_kernel": "vnni"},
        {"model": msgspec.structs.replace(PRESETS["tiny"], num_kv_heads=1)},
    ],
    ids=lambda change: next(iter(change)),
)
def test_the_model_digest_changes_with_what_the_kv_means(change):
    assert kv_tier_digest(_fingerprint(**change)) != kv_tier_digest(_fingerprint())


def test_the_model_digest_ignores_the_control_protocols_version():
    digest = kv_tier_digest(_fingerprint())
    assert len(digest) == 16 and kv_tier_digest(_fingerprint(protocol_version=PROTOCOL_VERSION + 1)) == digest
