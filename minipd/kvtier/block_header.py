"""What is stored with each block, and the check a fetched value must pass before one byte of it
is used.

A stored value is `header || payload`: the payload is the block's buffers concatenated in order
(one per layer for a layer-major pool), the header 64 bytes, little-endian:

    magic "MINIPDKV" | version u16 | reserved u16 | block size u32 | payload length u64 |
    model digest 16 B | chain digest 16 B | payload CRC-32 u32 | reserved u32

A value passes only if every field is what the fetching tier expects: its magic and version, its
own model digest (two models sharing one store never mix, even under a forged or colliding key),
the block size and chain digest of the key it asked for (the chain digest covers every token up
to and including the block, more than the block's own token ids), the payload length it has room
for, and the CRC of the payload as fetched. CRC-32 (zlib), not a cryptographic hash: it catches
corruption and truncation at ~6 GB/s, where blake2b runs at ~0.7 GB/s here; the identity checks
are the digests above. It is not a defence against someone who can write to the store (the store
is trusted as the instances' own network is: docs/kv-tier.md).
"""

from __future__ import annotations

import struct
import zlib
from typing import Iterable

MAGIC = b"MINIPDKV"
VERSION = 1
_LAYOUT = struct.Struct("<8sHHIQ16s16sII")
HEADER_BYTES = _LAYOUT.size  # 64


def payload_crc(buffers: Iterable[memoryview]) -> int:
    """CRC-32 of the buffers' bytes in sequence (zlib releases the GIL on large buffers)."""
    crc = 0
    for buffer in buffers:
        crc = zlib.crc32(buffer, crc)
    return crc


def encode_header(model_digest: bytes, block_size: int, chain: bytes, payload: list[memoryview]) -> bytes:
    """The header of a block whose payload is `payload` (byte memoryviews, in order)."""
    length = sum(b.nbytes for b in payload)
    return _LAYOUT.pack(MAGIC, VERSION, 0, block_size, length, model_digest, chain, payload_crc(payload), 0)


def header_mismatch(
    header: memoryview | bytes, model_digest: bytes, block_size: int, chain: bytes, payload_length: int
) -> str | None:
    """Why `header` is not the header of the block expected (None: it is, so far as the header
    goes; the payload's CRC is `payload_mismatch`'s to check). The reasons are what the tier
    counts and logs."""
    if len(header) < HEADER_BYTES:
        return "truncated"
    magic, version, _, size, length, model, stored_chain, _, _ = _LAYOUT.unpack_from(header)
    if magic != MAGIC:
        return "not a minipd block"
    if version != VERSION:
        return f"header version {version}"
    if model != model_digest:
        return "another model"
    if size != block_size or stored_chain != chain:
        return "another block"
    if length != payload_length:
        return "payload length"
    return None


def payload_mismatch(header: memoryview | bytes, payload: list[memoryview]) -> str | None:
    """Why the payload is not the one the header describes (None: it is)."""
    stored_crc = _LAYOUT.unpack_from(header)[7]
    return None if payload_crc(payload) == stored_crc else "checksum"
