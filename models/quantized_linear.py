"""4-bit weights kept as groups of 32 and multiplied by torch's CPU int4 kernel, never made dense.

A `QuantizedLinear` holds a [out, in] weight as unsigned 4-bit values q (0..15) per element and,
per row and per group of `GROUP_SIZE` consecutive inputs, a scale and a zero:
w = (q - 8) * scale + zero, the format of `torch.ops.aten._weight_int4pack_mm_for_cpu` (the
kernel torchao's int4 weight-only CPU path uses). GGUF's 4-bit blocks are exactly this shape:
Q4_0 stores d and w = d * (q - 8) (scale d, zero 0); Q4_1 stores d and m and w = d * q + m
(scale d, zero m + 8d). `from_q4` takes q, scale and zero as a loader decoded them.

Why bfloat16 scales: the kernel's only vectorized (AVX512) path takes bfloat16 activations and
bfloat16 scales and zeros; its float32 and float16 paths are scalar loops, 35-400x slower than
the dense bf16 matmul. With float32 scales the kernel reproduces GGUF's float32 dequantization
bit for bit, but at bfloat16 d and m + 8d keep 8 significant bits, so the weights it multiplies
differ from GGUF's by up to 8 half-steps of the scale plus half a step of the zero (SmolLM2's
Q4_1 tensors: max |dw| 0.0215, mean 0.00026, at most 0.24% of a tensor's norm; rounding the
dequantized weights to bfloat16, as the dense path does, moves them by max 0.0137, mean
0.00017). `dequantize()` returns exactly the weights the kernel multiplies.

Memory: the packed values are half a byte per weight and the scales and zeros 4 bytes per 32
weights, 0.625 bytes per weight, as much as GGUF's Q4_1 blocks (20 bytes per 32).
"""

from __future__ import annotations

import torch
from torch import nn

GROUP_SIZE = 32
OUT_MULTIPLE = 16  # the CPU packing works on blocks of 16 output rows
# `_convert_weight_to_int4pack_for_cpu`'s inner tiling argument: the CPU kernel ignores it (it
# packs [out, in / 2] bytes itself) but the signature requires one.
_INNER_K_TILES = 1


def kernel_available() -> bool:
    ops = torch.ops.aten
    return hasattr(ops, "_weight_int4pack_mm_for_cpu") and hasattr(ops, "_convert_weight_to_int4pack_for_cpu")


class QuantizedLinear(nn.Module):
    """y = x @ w.T for a bfloat16 x [rows, in], w held as 4-bit groups; no bias (Llama has none)."""

    def __init__(self, packed: torch.Tensor, scales_zeros: torch.Tensor, in_features: int, out_features: int):
        super().__init__()
        # Buffers, so `state_dict` (and with it the instances' weight digest) covers them.
        self.register_buffer("packed", packed)  # uint8 [out, in / 2], the kernel's layout
        self.register_buffer("scales_zeros", scales_zeros)  # bfloat16 [in / GROUP_SIZE, out, 2]
        self.in_features, self.out_features = in_features, out_features

    @staticmethod
    def supports(out_features: int, in_features: int) -> bool:
        return out_features % OUT_MULTIPLE == 0 and in_features % GROUP_SIZE == 0

    @classmethod
    def from_q4(cls, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> QuantizedLinear:
        """q: integers 0..15 [out, in]; scale, zero: float [out, in / GROUP_SIZE] (w = (q - 8) * scale + zero)."""
        out_features, in_features = q.shape
        if in_features % GROUP_SIZE or scale.shape != (out_features, in_features // GROUP_SIZE):
            raise ValueError(
                f"quantized linear: a [{out_features}, {in_features}] weight needs inputs in groups of "
                f"{GROUP_SIZE} and scales of shape [{out_features}, {in_features // GROUP_SIZE}], "
                f"got {tuple(scale.shape)}"
            )
        if out_features % OUT_MULTIPLE:
            raise ValueError(f"quantized linear: {out_features} outputs; the kernel needs a multiple of {OUT_MULTIPLE}")
        if scale.shape != zero.shape or int(q.min()) < 0 or int(q.max()) > 15:
            raise ValueError("quantized linear: q must hold 0..15 and zero match the scale's shape")
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), _INNER_K_TILES)
        scales_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).to(torch.bfloat16).contiguous()
        return cls(packed, scales_zeros, in_features, out_features)

    @classmethod
    def concat(cls, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> QuantizedLinear:
        """One module for several weights that read the same input (q, k, v; gate, up): their
        (q, scale, zero) stacked along the outputs, as the dense path fuses them."""
        return cls.from_q4(*(torch.cat(column) for column in zip(*parts)))

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            raise TypeError(f"quantized linear: takes bfloat16 inputs, got {x.dtype}")
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP_SIZE, self.scales_zeros)

    def dequantize(self) -> torch.Tensor:
        """The float32 [out, in] weights the kernel multiplies (for tests and comparisons): the
        kernel run on the identity, in float32 so that nothing but the scales is rounded."""
        eye = torch.eye(self.in_features)
        return (
            torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP_SIZE, self.scales_zeros.float())
            .t()
            .contiguous()
        )
