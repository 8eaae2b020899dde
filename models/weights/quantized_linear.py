"""Weights kept in GGUF's blocks of 32 and multiplied by a CPU kernel that reads them; optionally a dense copy.

Three kernels (`kernel`), chosen by the loader (`--quantized-kernel`):
- "vnni" and "avx2" (kernels/vnni_kernels.py, minipd's own, for CPUs with AVX-512 VNNI or with AVX2
  only; the same bits on both): Q4_0, Q4_1 and Q8_0 weights held exactly as the file
  stores them (d and m in float16; 0.625 bytes per 4-bit weight, 1.125 per 8-bit one), the
  activations (bfloat16 or float32) quantized to int8 per block of 32 and multiplied by integer
  dot products, as llama.cpp does on the CPU. The activations' rounding is the deviation from
  the dense model (SmolLM2: see tests/smollm2/test_smollm2_quantized.py).
- "torch" (bfloat16 activations only): torch's `_weight_int4pack_mm_for_cpu` (the kernel torchao's int4 weight-only CPU
  path uses), 4-bit only, whose format holds per row and group of 32 inputs a scale and a zero:
  w = (q - 8) * scale + zero, with the activations in bfloat16 and the scales rounded to it.

A `QuantizedLinear` is built from q (0..15) per element and, per row and per group of
`GROUP_SIZE` consecutive inputs, a scale and a zero: w = (q - 8) * scale + zero. GGUF's 4-bit
blocks are exactly this shape: Q4_0 stores d and w = d * (q - 8) (scale d, zero 0); Q4_1 stores
d and m and w = d * q + m (scale d, zero m + 8d). `from_q4` takes q, scale and zero as a loader
decoded them; `from_q8` Q8_0's q (int8) and d (vnni and avx2 only).

Why bfloat16 scales (torch's kernel): its only vectorized (AVX512) path takes bfloat16 activations and
bfloat16 scales and zeros; its float32 and float16 paths are scalar loops, 35-400x slower than
the dense bf16 matmul. With float32 scales the kernel reproduces GGUF's float32 dequantization
bit for bit, but at bfloat16 d and m + 8d keep 8 significant bits, so the weights it multiplies
differ from GGUF's by up to 8 half-steps of the scale plus half a step of the zero (SmolLM2's
Q4_1 tensors: max |dw| 0.0215, mean 0.00026, at most 0.24% of a tensor's norm; rounding the
dequantized weights to bfloat16, as the dense path does, moves them by max 0.0137, mean
0.00017). `dequantize()` returns exactly the weights the kernel multiplies (for "vnni" and
"avx2": the file's own).

Memory: the packed values are half a byte per weight and the scales and zeros 4 bytes per 32
weights, 0.625 bytes per weight, as much as GGUF's Q4_1 blocks (20 bytes per 32).

Dense copy (`from_q4(..., keep_dense=True)`, the "mixed" weights format): either kernel's
cost grows about linearly with the rows while a dense bf16 matmul's barely grows, so from a few
rows on the dense copy of the same weights is faster, 15x at 512 rows (`DENSE_MIN_ROWS`). The
copy holds exactly `dequantize()`'s weights in the model's dtype (rounded to bfloat16: 2 bytes
per weight on top of the 0.625; float32: 4), outside the state dict, so the weight digest stays
that of the 4-bit weights.
`forward` takes a `RowSplit` saying which rows multiply it; every other row still reads the
4-bit weights.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch
from torch import nn

from minipd.models.kernels import kquant_packing, vnni_kernels
from minipd.models.kernels.kquant_packing import FORMATS
from minipd.models.weights import prepacked_linear
from minipd.models.weights.row_split import DENSE_MIN_ROWS as DENSE_MIN_ROWS  # the loader's and flags' name for it
from minipd.models.weights.row_split import RowSplit

logger = logging.getLogger(__name__)

GROUP_SIZE = 32
INT8_KERNELS = tuple(vnni_kernels.VARIANTS)  # ("vnni", "avx2"): minipd's own, fastest first
KERNELS = (*INT8_KERNELS, "torch")
OUT_MULTIPLE = 16  # the CPU packing works on blocks of 16 output rows
# `_convert_weight_to_int4pack_for_cpu`'s inner tiling argument: the CPU kernel ignores it (it
# packs [out, in / 2] bytes itself) but the signature requires one.
_INNER_K_TILES = 1


class Segment(NamedTuple):
    """Outputs of one weight in one block format, packed for minipd's kernels: `packed` uint8
    [out_features / 16, bytes per tile] in `FORMATS[...]` code `format_code`."""

    format_code: int
    packed: torch.Tensor
    out_features: int


_BITS = {FORMATS["q4"]: 4, FORMATS["q8"]: 8, FORMATS["q4_k"]: 4, FORMATS["q6_k"]: 6}


def choose_kernel(choice: str = "auto") -> str:
    """What `choice` ("auto", "vnni", "avx2" or "torch") resolves to in this process: "auto" is
    the first of minipd's kernels that can run here (building it on first use), else "torch".
    ValueError saying why where the chosen kernel cannot run."""
    if choice not in ("auto", *KERNELS):
        raise ValueError(f"quantized kernel: unknown {choice!r}; choose one of auto, {', '.join(KERNELS)}")
    if choice in INT8_KERNELS:
        if (why := vnni_kernels.unavailable(choice)) is not None:
            raise ValueError(f"quantized kernel {choice}: {why}")
        return choice
    if choice == "auto":
        if (best := vnni_kernels.best()) is not None:
            return best
        logger.warning(
            "quantized kernel: none of minipd's runs here (%s); multiplying with torch's int4 kernel",
            vnni_kernels.why_none(),
        )
    if not kernel_available():
        raise ValueError("quantized kernel torch: this torch has no _weight_int4pack_mm_for_cpu")
    return "torch"


def kernel_available() -> bool:
    ops = torch.ops.aten
    return hasattr(ops, "_weight_int4pack_mm_for_cpu") and hasattr(ops, "_convert_weight_to_int4pack_for_cpu")


class QuantizedLinear(nn.Module):
    """y = x @ w.T for a bfloat16 x [rows, in], w held as blocks; no bias (Llama has none)."""

    def __init__(
        self,
        packed: torch.Tensor,
        scales_zeros: torch.Tensor | None,
        in_features: int,
        out_features: int,
        kernel: str = "torch",
        bits: int = 4,
    ):
        super().__init__()
        if kernel in INT8_KERNELS:
            vnni_kernels.load(kernel)  # builds it on first use; RuntimeError saying why it cannot run here
        # Buffers, so `state_dict` (and with it the instances' weight digest) covers them.
        # torch: uint8 [out, in / 2] in its layout; vnni, avx2: uint8 [out / 16, ...] (vnni_kernels.pack_q4 / pack_q8).
        self.register_buffer("packed", packed)
        if scales_zeros is not None:  # torch only: bfloat16 [in / GROUP_SIZE, out, 2]
            self.register_buffer("scales_zeros", scales_zeros)
        self.in_features, self.out_features = in_features, out_features
        self.kernel, self.bits = kernel, bits
        # minipd's kernels: the segments' formats and outputs (`from_segments`; else one of Q4 or Q8)
        self.formats: tuple[int, ...] = (FORMATS["q8"] if bits == 8 else FORMATS["q4"],)
        self.outs: tuple[int, ...] = (out_features,)
        # The dense copy (`from_q4`'s keep_dense): plain attributes, so the state dict stays the 4-bit one.
        self.dense: torch.Tensor | None = None  # [out, in] in the model's dtype, kept only where it cannot be packed
        self.dense_packed: torch.Tensor | None = None  # its oneDNN-packed form (prepacked_linear.py)

    @staticmethod
    def supports(out_features: int, in_features: int) -> bool:
        return out_features % OUT_MULTIPLE == 0 and in_features % GROUP_SIZE == 0

    @classmethod
    def from_q4(
        cls,
        q: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor,
        keep_dense: bool = False,
        kernel: str = "torch",
        dense_dtype: torch.dtype = torch.bfloat16,
    ) -> QuantizedLinear:
        """q: integers 0..15 [out, in]; scale, zero: float [out, in / GROUP_SIZE] (w = (q - 8) * scale + zero).
        `keep_dense`: also keep the dense copy that `forward` multiplies a `RowSplit`'s
        dense rows by: `dequantize()`'s weights in `dense_dtype`, computed here from q
        (SmolLM2 loads in 1.8 s instead of 1.4; running the kernel on an identity instead took
        3.4 s); only its packed form is kept where oneDNN takes it. `kernel` "vnni" or "avx2" holds
        d = scale and m = zero - 8 * scale in float16, as GGUF does: they must be float16 values."""
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
        if kernel in INT8_KERNELS:
            d, m = scale.float(), zero.float() - 8 * scale.float()
            if not (torch.equal(d.half().float(), d) and torch.equal(m.half().float(), m)):
                raise ValueError(f"quantized linear: the {kernel} kernel holds d and m = zero - 8 * scale as float16")
            linear = cls(vnni_kernels.pack_q4(q, d.half(), m.half()), None, in_features, out_features, kernel)
            weights = lambda: q.float() * _groups(d) + _groups(m)  # noqa: E731 (GGUF's own, in float32)
        elif kernel == "torch":
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), _INNER_K_TILES)
            scales_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).to(torch.bfloat16).contiguous()
            linear = cls(packed, scales_zeros, in_features, out_features, kernel)
            weights = lambda: (q.float() - 8) * _groups(_bf16(scale)) + _groups(_bf16(zero))  # noqa: E731
        else:
            raise ValueError(f"quantized linear: unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
        if keep_dense:
            weight = weights().to(dense_dtype)
            linear.dense_packed = prepacked_linear.prepack(weight)
            linear.dense = weight if linear.dense_packed is None else None
        return linear

    @classmethod
    def from_q8(cls, q: torch.Tensor, d: torch.Tensor, kernel: str = "vnni") -> QuantizedLinear:
        """Q8_0's q (int8 [out, in]) and d (float16 values [out, in / GROUP_SIZE]), w = d * q, for
        the "vnni" or "avx2" kernel (torch has none whose format holds per-block scales)."""
        if kernel not in INT8_KERNELS:
            raise ValueError(f"quantized linear: Q8_0 weights need one of {', '.join(INT8_KERNELS)}, not {kernel!r}")
        out_features, in_features = q.shape
        if not cls.supports(out_features, in_features) or d.shape != (out_features, in_features // GROUP_SIZE):
            raise ValueError(f"quantized linear: a [{out_features}, {in_features}] Q8_0 weight does not fit the kernel")
        return cls(vnni_kernels.pack_q8(q, d.half()), None, in_features, out_features, kernel, bits=8)

    @classmethod
    def from_segments(
        cls,
        segments: list[Segment],
        in_features: int,
        kernel: str,
        dense: torch.Tensor | None = None,
        dense_dtype: torch.dtype = torch.bfloat16,
    ) -> QuantizedLinear:
        """One module for segments of any block formats stacked along the outputs (q, k, v of a
        Q4_K_M file: Q4_K, Q4_K, Q6_K), multiplied by minipd's `kernel` ("vnni" or "avx2"); adjacent
        segments of one format become one. `dense`: float32 [out, in], the weights exactly (GGUF's
        dequantization), kept in `dense_dtype` as the dense copy for prefill rows (None: none).
        `bits` is 8 for Q8 blocks alone, 6 where any segment is Q6_K, else 4."""
        if kernel not in INT8_KERNELS:
            raise ValueError(f"quantized linear: block segments need one of {', '.join(INT8_KERNELS)}, not {kernel!r}")
        merged: list[Segment] = []
        for seg in segments:
            tiles, tile = seg.out_features // OUT_MULTIPLE, kquant_packing.tile_bytes(seg.format_code, in_features)
            if seg.out_features % OUT_MULTIPLE or tuple(seg.packed.shape) != (tiles, tile):
                raise ValueError(
                    f"quantized linear: a segment of {seg.out_features} outputs in format {seg.format_code} over "
                    f"{in_features} inputs must be packed as [{tiles}, {tile}], not {tuple(seg.packed.shape)}"
                )
            if merged and merged[-1].format_code == seg.format_code:
                last = merged.pop()
                seg = Segment(
                    seg.format_code, torch.cat([last.packed, seg.packed]), last.out_features + seg.out_features
                )
            merged.append(seg)
        packed = merged[0].packed if len(merged) == 1 else torch.cat([m.packed.reshape(-1) for m in merged])
        out_features = sum(m.out_features for m in merged)
        bits = max(_BITS[m.format_code] for m in merged)
        linear = cls(packed.contiguous(), None, in_features, out_features, kernel, bits=bits)
        linear.formats, linear.outs = tuple(m.format_code for m in merged), tuple(m.out_features for m in merged)
        if dense is not None:
            if dense.shape != (out_features, in_features):
                raise ValueError(
                    f"quantized linear: a dense copy of shape {tuple(dense.shape)} for [{out_features}, {in_features}]"
                )
            weight = dense.to(dense_dtype)
            linear.dense_packed = prepacked_linear.prepack(weight)
            linear.dense = weight if linear.dense_packed is None else None
        return linear

    @classmethod
    def concat(
        cls,
        parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        keep_dense: bool = False,
        kernel: str = "torch",
        dense_dtype: torch.dtype = torch.bfloat16,
    ) -> QuantizedLinear:
        """One module for several weights that read the same input (q, k, v; gate, up): their
        (q, scale, zero) stacked along the outputs, as the dense path fuses them."""
        columns = (torch.cat(column) for column in zip(*parts))
        return cls.from_q4(*columns, keep_dense=keep_dense, kernel=kernel, dense_dtype=dense_dtype)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers())

    @property
    def dense_nbytes(self) -> int:
        """Bytes of the dense copy (0 without one)."""
        copy = self.dense_packed if self.dense_packed is not None else self.dense
        return 0 if copy is None else copy.numel() * copy.element_size()

    @property
    def has_dense(self) -> bool:
        return self.dense is not None or self.dense_packed is not None

    def forward(self, x: torch.Tensor, rows: RowSplit | None = None) -> torch.Tensor:
        """x @ w.T; with a dense copy and `rows`, each `rows.dense` range through the copy and
        the other rows through the 4-bit weights. Without either, every row reads the 4-bit ones.
        x is bfloat16, or float32 for the "vnni" and "avx2" kernels; y is in x's dtype."""
        if x.dtype != torch.bfloat16 and not (x.dtype == torch.float32 and self.kernel in INT8_KERNELS):
            raise TypeError(f"quantized linear: the {self.kernel} kernel does not take {x.dtype} inputs")
        if rows is None or not rows.dense or not self.has_dense:
            return self._quantized(x)
        if rows.rest is None and len(rows.dense) == 1:
            return self._dense(x)  # one segment of every row: no output to assemble
        out = x.new_empty(x.shape[0], self.out_features)
        for start, stop in rows.dense:
            out[start:stop] = self._dense(x[start:stop])
        if rows.rest is not None:
            out[rows.rest] = self._quantized(x[rows.rest])
        return out

    def _quantized(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel in INT8_KERNELS:
            return vnni_kernels.blocks_mm(x, self.packed, self.in_features, self.formats, self.outs, self.kernel)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP_SIZE, self.scales_zeros)

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        return prepacked_linear.linear(x, self.dense, None, self.dense_packed)

    def dequantize(self) -> torch.Tensor:
        """The float32 [out, in] weights the kernel multiplies (for tests and comparisons): for
        "vnni" and "avx2" the file's own, from the packed blocks; for "torch" the kernel run on the
        identity, in float32 so that nothing but the scales is rounded."""
        if self.kernel in INT8_KERNELS:
            return _dequantize_segments(self.packed, self.in_features, self.formats, self.outs)
        eye = torch.eye(self.in_features)
        return (
            torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP_SIZE, self.scales_zeros.float())
            .t()
            .contiguous()
        )


def _dequantize_segments(packed: torch.Tensor, in_features: int, formats, outs) -> torch.Tensor:
    """The float32 [sum(outs), in] weights of packed segments, each as GGUF dequantizes its format."""
    flat, start, parts = packed.reshape(-1), 0, []
    for code, out in zip(formats, outs):
        size = out // OUT_MULTIPLE * kquant_packing.tile_bytes(code, in_features)
        seg = flat[start : start + size].view(out // OUT_MULTIPLE, -1)
        if code == FORMATS["q4_k"]:
            parts.append(kquant_packing.dequantize_q4k(seg, out, in_features))
        elif code == FORMATS["q6_k"]:
            parts.append(kquant_packing.dequantize_q6k(seg, out, in_features))
        else:
            parts.append(vnni_kernels.dequantize(seg, out, in_features, _BITS[code]))
        start += size
    return torch.cat(parts)


def _groups(t: torch.Tensor) -> torch.Tensor:  # per group of inputs -> per input
    return t.float().repeat_interleave(GROUP_SIZE, 1)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()
