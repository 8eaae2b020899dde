"""What one control-plane connection may make a process hold, and why each cap is what it is.

Before the handshake a server reads only `Hello` and `Prove`: frames of at most
HANDSHAKE_MAX_FRAME_BYTES, and a connection that has not finished it within
HANDSHAKE_TIMEOUT_S is closed. After it, frames are capped by `max_frame_bytes(max_model_len)`:
the largest legitimate frame is a `Prefill` (router -> prefill instance) carrying
max_model_len token ids, a block id per block, the sampling parameters and the decode
instance's transport description; a client's `ClientGenerate` may carry the prompt as text
instead, which BYTES_PER_TOKEN bounds too. A partially received frame is the only thing a
connection buffers, so a listener holds at most `max_connections` times that cap; what
waits to be sent to a peer that does not read is capped by MAX_WRITE_BUFFER_BYTES.
"""

from __future__ import annotations

from minipd.engine.sampling_params import MAX_STOP_BYTES, MAX_STOP_TOKEN_IDS
from minipd.transports.connection_slots import DEFAULT_MAX_CONNECTIONS
from minipd.transports.wire import MAX_DESCRIPTION_BYTES, MAX_REQUEST_ID_CHARS

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "MAX_REQUEST_ID_CHARS",
    "HANDSHAKE_MAX_FRAME_BYTES",
    "HANDSHAKE_TIMEOUT_S",
    "MAX_WRITE_BUFFER_BYTES",
    "max_frame_bytes",
]

HANDSHAKE_MAX_FRAME_BYTES = 4 << 10  # a Hello or a Prove: a role, a nonce or a proof, an id
HANDSHAKE_TIMEOUT_S = 10.0
# Tags, field names, request ids (MAX_REQUEST_ID_CHARS), the fingerprint, scalars.
FRAME_OVERHEAD_BYTES = 16 << 10
# Stop strings, stop token ids (5 bytes each as msgpack uint32) and the scalar fields.
SAMPLING_BYTES = MAX_STOP_BYTES + 5 * MAX_STOP_TOKEN_IDS + (1 << 10)
# A token id and its share of block ids are at most 10 bytes; a prompt sent as text gets
# 64 UTF-8 bytes per token of max_model_len (English averages about 4).
BYTES_PER_TOKEN = 64
# Outgoing bytes queued for a peer that does not read; past this the connection is closed.
MAX_WRITE_BUFFER_BYTES = 32 << 20


def max_frame_bytes(max_model_len: int) -> int:
    """The cap on one frame between peers serving sequences of up to `max_model_len` tokens
    (1024 tokens: 166 KiB; 32k tokens: 2.1 MiB)."""
    return FRAME_OVERHEAD_BYTES + SAMPLING_BYTES + MAX_DESCRIPTION_BYTES + BYTES_PER_TOKEN * max(0, max_model_len)
