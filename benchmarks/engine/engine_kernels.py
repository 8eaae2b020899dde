"""One decoder layer's projections (q/k/v, o, gate/up, down) at a few batch sizes: torch's int4
kernel and, where it runs, minipd's VNNI kernel on the same 4-bit weights (quantized_linear.py)
against oneDNN's prepacked bf16 matmul (prepacked_linear.py), on the model's shapes.

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

from minipd.models.arch.model_config import ModelConfig
from minipd.models.kernels import vnni_kernels
from minipd.models.weights import prepacked_linear
from minipd.models.weights.quantized_linear import GROUP_SIZE, QuantizedLinear

MS = 1e3


def _shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """(out, in) of the fused projections of one layer."""
    h, f, d = config.hidden_size, config.intermediate_size, config.head_dim
    return [((config.num_heads + 2 * config.num_kv_heads) * d, h), (h, config.num_heads * d), (2 * f, h), (h, f)]


def _layer(shapes: list[tuple[int, int]], gen: torch.Generator, kernels: list[str]) -> list[tuple]:
    out = []
    for n, k in shapes:
        dense = torch.randn(n, k, generator=gen).to(torch.bfloat16)
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        scale = (torch.rand(n, k // GROUP_SIZE, generator=gen) * 0.01).half().float()  # float16 values, as GGUF's
        quantized = {
            kernel: QuantizedLinear.from_q4(q, scale, torch.zeros_like(scale), kernel=kernel) for kernel in kernels
        }
        out.append((dense, prepacked_linear.prepack(dense), quantized))
    return out


def layer_matmuls(config: ModelConfig, batches: list[int], rounds: int = 15) -> dict[int, dict[str, float]]:
    """Per batch size: `dense_ms`, `int4_ms` (torch's kernel) and, where it runs, `vnni_ms` (one
    layer's projections, median per layer), and each kernel's `*_vs_dense`."""
    gen = torch.Generator().manual_seed(0)
    kernels = ["torch"] + (["vnni"] if vnni_kernels.unavailable() is None else [])
    layers = [_layer(_shapes(config), gen, kernels) for _ in range(config.num_layers)]
    result = {}
    with torch.inference_mode():
        for b in batches:
            inputs = {k: torch.randn(b, k, generator=gen).to(torch.bfloat16) for _, k in _shapes(config)}

            def dense_pass(inputs: dict[int, torch.Tensor] = inputs) -> None:
                for layer in layers:
                    for dense, packed, _ in layer:
                        prepacked_linear.linear(inputs[dense.shape[1]], dense, None, packed)

            def quantized_pass(kernel: str, inputs: dict[int, torch.Tensor] = inputs) -> None:
                for layer in layers:
                    for dense, _, quantized in layer:
                        quantized[kernel](inputs[dense.shape[1]])

            passes = {"dense": dense_pass, "int4": lambda: quantized_pass("torch")}
            if "vnni" in kernels:
                passes["vnni"] = lambda: quantized_pass("vnni")
            times: dict[str, list[float]] = {name: [] for name in passes}
            for r in range(rounds):  # alternating, so drift hits all alike
                for name, run in list(passes.items())[:: 1 if r % 2 else -1]:
                    start = time.perf_counter()
                    run()
                    times[name].append((time.perf_counter() - start) / len(layers))
            ms = {name: statistics.median(t) * MS for name, t in times.items()}
            result[b] = {f"{name}_ms": value for name, value in ms.items()}
            result[b].update({f"{name}_vs_dense": ms[name] / ms["dense"] for name in ms if name != "dense"})
    return result
