"""Block keys that cannot lie: a key names what the block's KV *means*, so two blocks under one
key hold the same bytes whoever computed them.

A block's KV depends on the model (weights, dtype, KV layout: the `model_digest`, built from an
instance's compatibility fingerprint by `minipd.disagg.fingerprint.kv_tier_digest`), the block
size, and every token up to and including the block (attention looks back over the whole
prefix). So the key is built from the model digest, the block size and a chained blake2b digest
`c_i = blake2b(c_{i-1} || tokens of block i)` (`c_{-1}` = 16 zero bytes; tokens as little-endian
int64). blake2b, not Python's `hash`: the key must be the same in every process and on every host
(`hash` of a tuple is only stable by accident), and a 128-bit digest makes a collision between two
prefixes as unlikely as a random bit flip in the store is likely not.
"""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple, Sequence

KEY_PREFIX = "minipd-kv/v1"  # the version changes whenever the key or header derivation does
DIGEST_BYTES = 16
MODEL_DIGEST_BYTES = 16
ROOT_CHAIN = bytes(DIGEST_BYTES)


class BlockKey(NamedTuple):
    """One block's name in the store (`name`) and the chain digest it was derived from (`chain`),
    which the block's stored header repeats so a fetch can check it."""

    name: str
    chain: bytes


def chain_digests(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chained digests of every full block of `token_ids` (a partial last block has none)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    digests, parent = [], ROOT_CHAIN
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        tokens = struct.pack(f"<{block_size}q", *token_ids[start : start + block_size])
        parent = hashlib.blake2b(parent + tokens, digest_size=DIGEST_BYTES).digest()
        digests.append(parent)
    return digests


def key_name(model_digest: bytes, block_size: int, chain: bytes) -> str:
    """`minipd-kv/v1/<model digest>/<block size>/<chain digest>`, hex: readable, and a model's
    keys share a prefix (a store's own tools can list or drop one model's blocks)."""
    check_model_digest(model_digest)
    return f"{KEY_PREFIX}/{model_digest.hex()}/{block_size}/{chain.hex()}"


def block_keys(model_digest: bytes, token_ids: Sequence[int], block_size: int) -> list[BlockKey]:
    """The keys of every full block of `token_ids`, in order."""
    return [
        BlockKey(key_name(model_digest, block_size, chain), chain) for chain in chain_digests(token_ids, block_size)
    ]


def check_model_digest(model_digest: bytes) -> None:
    if not isinstance(model_digest, bytes) or len(model_digest) != MODEL_DIGEST_BYTES:
        raise ValueError(f"a model digest is {MODEL_DIGEST_BYTES} bytes, got {model_digest!r}")
