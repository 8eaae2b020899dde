"""Small latency profiles and runs for the planner tests."""

from __future__ import annotations

from minipd.ops.planner.latency_model import DecodeModel, PrefillModel
from minipd.ops.planner.latency_profile import LatencyProfile

UNLIMITED = 1 << 40


def profile(prefill=(0.0, 0.0, 0.0), decode=(0.0, 0.0, 0.0), **fields) -> LatencyProfile:
    """A profile with the given coefficients; unlimited KV and batches unless told otherwise."""
    values = {
        "name": "test",
        "model": "test",
        "dtype": "float32",
        "device": "sim",
        "num_layers": 1,
        "kv_bytes_per_token": 1,
        "kv_capacity_tokens": UNLIMITED,
        "max_batched_tokens": 1 << 20,
        "max_num_seqs": 1 << 20,
        "prefill": PrefillModel(*prefill),
        "decode": DecodeModel(*decode),
    }
    values.update(fields)
    return LatencyProfile(**values)
