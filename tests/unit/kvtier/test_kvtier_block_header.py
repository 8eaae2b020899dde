"""The block header: what a fetched value must prove before it is used."""

from __future__ import annotations

import pytest

from minipd.kvtier.block_header import HEADER_BYTES, encode_header, header_mismatch, payload_mismatch

MODEL, CHAIN = bytes(range(16)), bytes(range(16, 32))
PAYLOAD = [memoryview(bytes(range(256)) * 4), memoryview(b"\x07" * 512)]
LENGTH = 1536


def test_a_header_describes_its_block():
    header = encode_header(MODEL, 16, CHAIN, PAYLOAD)
    assert len(header) == HEADER_BYTES == 64
    assert header_mismatch(header, MODEL, 16, CHAIN, LENGTH) is None
    assert payload_mismatch(header, PAYLOAD) is None
    # The CRC covers the buffers in sequence, so the same bytes split otherwise still match.
    joined = memoryview(b"".join(PAYLOAD))
    assert payload_mismatch(header, [joined[:100], joined[100:]]) is None


@pytest.mark.parametrize(
    "expected, reason",
    [
        ((bytes(16), 16, CHAIN, LENGTH), "another model"),
        ((MODEL, 32, CHAIN, LENGTH), "another block"),
        ((MODEL, 16, bytes(16), LENGTH), "another block"),
        ((MODEL, 16, CHAIN, LENGTH - 1), "payload length"),
    ],
)
def test_a_header_of_something_else_says_what(expected, reason):
    assert header_mismatch(encode_header(MODEL, 16, CHAIN, PAYLOAD), *expected) == reason


def test_foreign_short_and_other_version_headers_are_refused():
    header = encode_header(MODEL, 16, CHAIN, PAYLOAD)
    assert header_mismatch(header[:-1], MODEL, 16, CHAIN, LENGTH) == "truncated"
    assert header_mismatch(b"X" + header[1:], MODEL, 16, CHAIN, LENGTH) == "not a minipd block"
    assert header_mismatch(header[:8] + b"\x02" + header[9:], MODEL, 16, CHAIN, LENGTH) == "header version 2"


def test_a_flipped_payload_bit_fails_the_checksum():
    header = encode_header(MODEL, 16, CHAIN, PAYLOAD)
    flipped = bytearray(b"".join(PAYLOAD))
    flipped[700] ^= 0x10
    assert payload_mismatch(header, [memoryview(bytes(flipped))]) == "checksum"
