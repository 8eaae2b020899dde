"""How many bytes of KV one token takes, and how many tokens an instance's memory holds."""

from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype: unknown {dtype!r}; choose one of {sorted(DTYPE_BYTES)}") from None


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: str) -> int:
    """K and V of every layer: 2 * layers * kv_heads * head_dim * dtype bytes. Under tensor
    parallelism the heads are spread over the GPUs but the instance as a whole still holds
    (and sends) this many bytes per token."""
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if value < 1:
            raise ValueError(f"{name}: must be >= 1, got {value}")
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes(dtype)


def kv_capacity_tokens(memory_bytes: float, weights_bytes: float, reserved_bytes: float, bytes_per_token: int) -> int:
    """Tokens of KV that fit in what is left of `memory_bytes` (all GPUs of the instance,
    already scaled by the fraction the engine may use) after the weights and a reserve for
    activations and workspace."""
    free = memory_bytes - weights_bytes - reserved_bytes
    if free <= 0:
        raise ValueError(
            f"KV capacity: weights ({weights_bytes / 2**30:.1f} GiB) and reserve "
            f"({reserved_bytes / 2**30:.1f} GiB) do not fit in {memory_bytes / 2**30:.1f} GiB"
        )
    return int(free // bytes_per_token)
