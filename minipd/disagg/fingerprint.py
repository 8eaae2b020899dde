"""The compatibility fingerprint two instances compare before KV moves between them."""

from __future__ import annotations

import hashlib

import msgspec
import torch

from minipd.control.messages import PROTOCOL_VERSION, Fingerprint
from minipd.engine.engine import Engine

KV_LAYOUT = "layers,blocks,kv,block_size,kv_heads,head_dim"
DIGEST_BYTES = 16


def weights_digest(model: torch.nn.Module) -> str:
    """Hash of every parameter (names, shapes, dtypes, values), so same config with other
    weights is caught too."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for name, tensor in sorted(model.state_dict().items()):
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        h.update(tensor.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def engine_fingerprint(engine: Engine) -> Fingerprint:
    return Fingerprint(
        protocol_version=PROTOCOL_VERSION,
        model=engine.model_config,
        weights_digest=engine.run_on_compute_thread(weights_digest, engine.model),
        dtype=engine.config.dtype,
        weights=engine.config.weights,
        quantized_kernel=engine.model.quantized_kernel,
        block_size=engine.config.block_size,
        kv_layout=KV_LAYOUT,
    )


def kv_tier_digest(fingerprint: Fingerprint) -> bytes:
    """The model digest the shared KV tier keys and checks every block by (minipd/kvtier/keys.py):
    every field of the fingerprint that decides what a block's KV bytes are (the model, its weights
    and how they are served, dtype, block size, KV layout), but not the control protocol's
    version, which does not. Stable across processes and hosts: sorted JSON, blake2b."""
    fields = msgspec.structs.asdict(fingerprint)
    del fields["protocol_version"]
    encoded = msgspec.json.encode(fields, order="sorted")
    return hashlib.blake2b(encoded, digest_size=DIGEST_BYTES, person=b"minipd-kv-tier").digest()
