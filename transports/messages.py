"""Wire messages shared by the tcp, ucx and nixl backends: msgspec Structs encoded as msgpack.

Everything here may arrive from the network, so it is decoded by a typed decoder with a size
cap, never unpickled. Runs on the wire are `(dst_start, num_blocks)` pairs: the receiver
needs only where the bytes go.
"""

from __future__ import annotations

import msgspec

# A pool description carries a NIXL agent's metadata (a few KiB) or a UCX worker address.
MAX_DESCRIPTION_BYTES = 1 << 20
# A layer header lists at most one run per block; 1 MiB holds ~100k runs.
MAX_HEADER_BYTES = 1 << 20


class PoolDescription(msgspec.Struct, frozen=True):
    """What `Transport.describe` returns: who we are, our pool's layout, and how to reach it
    (`endpoint`: "host:port" for tcp, a UCX worker address, or NIXL agent metadata)."""

    backend: str
    instance_id: str
    num_layers: int
    num_blocks: int
    block_bytes: int
    endpoint: bytes
    base_address: int = 0
    device_index: int = 0
    mem_type: str = "DRAM"


class Hello(msgspec.Struct, frozen=True, tag="hello"):
    """First message on a link: the sender's instance id (peer id as the receiver sees it)."""

    peer_id: str
    num_layers: int
    block_bytes: int


class LayerHeader(msgspec.Struct, frozen=True, tag="layer"):
    """Announces `num_bytes` of payload for `runs` of `layer` of `request_id`. For tcp the
    payload follows on the stream; for ucx run i arrives with tag `tag_base + i`; for nixl it
    has already been written when this arrives as a notification."""

    request_id: str
    layer: int
    runs: list[tuple[int, int]]
    num_bytes: int
    tag_base: int = 0


class Finish(msgspec.Struct, frozen=True, tag="finish"):
    """The sender wrote `num_bytes` in total for `request_id` and will write no more."""

    request_id: str
    num_bytes: int


class Abort(msgspec.Struct, frozen=True, tag="abort"):
    """The sender gave up on `request_id` and will write no more."""

    request_id: str


Message = Hello | LayerHeader | Finish | Abort

message_encoder = msgspec.msgpack.Encoder()
message_decoder = msgspec.msgpack.Decoder(Message)
description_decoder = msgspec.msgpack.Decoder(PoolDescription)


def decode_description(data: bytes) -> PoolDescription:
    """Decode a peer's description; raises ValueError if it is oversized or malformed."""
    if len(data) > MAX_DESCRIPTION_BYTES:
        raise ValueError(f"pool description of {len(data)} bytes exceeds the {MAX_DESCRIPTION_BYTES}-byte cap")
    try:
        return description_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed pool description: {exc}") from None


def decode_message(data: bytes | memoryview) -> Message:
    """Decode one header message; raises ValueError if it is oversized or malformed."""
    if len(data) > MAX_HEADER_BYTES:
        raise ValueError(f"header of {len(data)} bytes exceeds the {MAX_HEADER_BYTES}-byte cap")
    try:
        return message_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed header: {exc}") from None
