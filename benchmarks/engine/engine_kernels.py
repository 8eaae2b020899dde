"""One decoder layer's projections (q/k/v, o, gate/up, down) at a few batch sizes: torch's int4
kernel on 4-bit weights (quantized_linear.py) against oneDNN's prepacked bf16 matmul
(prepacked_linear.py), on the model's shapes.

The weights are random (the time does not depend on their values) and there are as many
distinct layers as the model has, passed through in turn, so each matmul streams its weights
from memory the way a decode step does; one layer looped on would sit in the cache and time
the arithmetic instead. A figure is the median over `rounds` passes, per layer. Call it on the
engine's compute thread, so that it runs on the same OpenMP team as the forward pass.
"""

from __future__ import annotations

import statistics
import time

import torch

from minipd.models import prepacked_linear
from minipd.models.model_config import ModelConfig
from minipd.models.quantized_linear import GROUP_SIZE, QuantizedLinear

MS = 1e3


def _shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """(out, in) of the fused projections of one layer."""
    h, f, d = config.hidden_size, config.intermediate_size, config.head_dim
    return [((config.num_heads + 2 * config.num_kv_heads) * d, h), (h, config.num_heads * d), (2 * f, h), (h, f)]


def _layer(shapes: list[tuple[int, int]], gen: torch.Generator) -> list[tuple]:
    out = []
    for n, k in shapes:
        dense = torch.randn(n, k, generator=gen).to(torch.bfloat16)
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        scale = torch.rand(n, k // GROUP_SIZE, generator=gen) * 0.01
        out.append((dense, prepacked_linear.prepack(dense), QuantizedLinear.from_q4(q, scale, -8 * scale)))
    return out


def layer_matmuls(config: ModelConfig, batches: list[int], rounds: int = 15) -> dict[int, dict[str, float]]:
    """Per batch size: `dense_ms` and `int4_ms` (one layer's projections, median per layer) and
    `int4_vs_dense`."""
    gen = torch.Generator().manual_seed(0)
    layers = [_layer(_shapes(config), gen) for _ in range(config.num_layers)]
    result = {}
    with torch.inference_mode():
        for b in batches:
            inputs = {k: torch.randn(b, k, generator=gen).to(torch.bfloat16) for _, k in _shapes(config)}

            def dense_pass(inputs: dict[int, torch.Tensor] = inputs) -> None:
                for layer in layers:
                    for dense, packed, _ in layer:
                        prepacked_linear.linear(inputs[dense.shape[1]], dense, None, packed)

            def int4_pass(inputs: dict[int, torch.Tensor] = inputs) -> None:
                for layer in layers:
                    for dense, _, quantized in layer:
                        quantized(inputs[dense.shape[1]])

            times: dict[str, list[float]] = {"dense": [], "int4": []}
            for r in range(rounds):  # alternating, so drift hits both alike
                for name, run in (("dense", dense_pass), ("int4", int4_pass))[:: 1 if r % 2 else -1]:
                    start = time.perf_counter()
                    run()
                    times[name].append((time.perf_counter() - start) / len(layers))
            dense_ms, int4_ms = (statistics.median(times[n]) * MS for n in ("dense", "int4"))
            result[b] = {"dense_ms": dense_ms, "int4_ms": int4_ms, "int4_vs_dense": int4_ms / dense_ms}
    return result
