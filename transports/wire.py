"""Wire messages shared by the tcp, ucx and nixl backends: msgspec Structs encoded as msgpack.

Everything here may arrive from the network, so it is decoded by a typed decoder with a size
cap, never unpickled. Runs on the wire are `(dst_start, num_blocks)` pairs: the receiver
needs only where the bytes go.
"""

from __future__ import annotations

import msgspec

# A pool description carries a NIXL agent's metadata or a UCX worker address: measured at
# 600 and 353 bytes on one host (shared memory, TCP); many RDMA devices make them a few KiB.
# It travels inside control-plane frames, whose cap it sets (`minipd.control.limits`).
MAX_DESCRIPTION_BYTES = 64 << 10
# A layer header lists at most one run per block; 1 MiB holds ~100k runs.
MAX_HEADER_BYTES = 1 << 20
# A layer header is its runs plus this much (field names, tag, a request id of at most
# MAX_REQUEST_ID_CHARS characters, layer and sizes); each (dst_start, num_blocks) run is at
# most an array marker and two uint32. A receiver caps headers at what its pool can need.
MAX_REQUEST_ID_CHARS = 256
LAYER_HEADER_BASE_BYTES = 2 << 10
RUN_WIRE_BYTES = 11
# Before a tcp link is authenticated only Challenge/Hello/HelloAck/Refused travel: tiny.
MAX_HANDSHAKE_HEADER_BYTES = 4 << 10


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


class Challenge(msgspec.Struct, frozen=True, tag="challenge"):
    """tcp, receiver -> sender, first on a new link: the receiver's nonce for the handshake."""

    nonce: bytes


class Hello(msgspec.Struct, frozen=True, tag="hello"):
    """First message from the sender: its instance id (peer id as the receiver sees it) and,
    on tcp, its nonce and its proof of the cluster secret (empty without a secret)."""

    peer_id: str
    num_layers: int
    block_bytes: int
    nonce: bytes = b""
    proof: bytes = b""


class HelloAck(msgspec.Struct, frozen=True, tag="hello_ack"):
    """tcp, receiver -> sender: the link is accepted; the receiver's proof of the secret."""

    proof: bytes = b""


class Refused(msgspec.Struct, frozen=True, tag="refused"):
    """tcp, receiver -> sender: the handshake failed, and why; the receiver then hangs up."""

    reason: str


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


Message = Challenge | Hello | HelloAck | Refused | LayerHeader | Finish | Abort

message_encoder = msgspec.msgpack.Encoder()
message_decoder = msgspec.msgpack.Decoder(Message)
description_decoder = msgspec.msgpack.Decoder(PoolDescription)


def max_layer_header_bytes(num_blocks: int) -> int:
    """The largest header a receiver with `num_blocks` blocks can legitimately be sent (a
    reservation holds at most every block, so no header lists more runs than that)."""
    return min(MAX_HEADER_BYTES, LAYER_HEADER_BASE_BYTES + RUN_WIRE_BYTES * num_blocks)


def decode_description(data: bytes) -> PoolDescription:
    """Decode a peer's description; raises ValueError if it is oversized or malformed."""
    if len(data) > MAX_DESCRIPTION_BYTES:
        raise ValueError(f"pool description of {len(data)} bytes exceeds the {MAX_DESCRIPTION_BYTES}-byte cap")
    try:
        return description_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed pool description: {exc}") from None


def decode_message(data: bytes | memoryview, max_bytes: int = MAX_HEADER_BYTES) -> Message:
    """Decode one header message; raises ValueError if it is over `max_bytes` or malformed."""
    if len(data) > max_bytes:
        raise ValueError(f"header of {len(data)} bytes exceeds the {max_bytes}-byte cap")
    try:
        return message_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed header: {exc}") from None
