"""The K-quants (Q4_K, Q6_K) laid out as minipd's kernels read them (kquant_tiles.h), and back.

Contract: `pack_q4k` / `pack_q6k` take a tensor's decoded parts exactly as GGUF stores them (the
integer q, the 6-bit or int8 sub-block scales, the float16 super-block scales) and keep every bit
of them: 4.625 bytes per 8 Q4_K weights (GGUF: 4.5; the 12 scale bytes of a super-block are spread
to one byte per 6-bit value) and 6.5625 per 8 Q6_K weights (as GGUF). `dequantize_q4k` /
`dequantize_q6k` read a packing back as float32 weights computed as GGUF dequantizes them
(gguf_dequantize.py), so a round trip equals the file's own dequantization bit for bit.

A segment's format code (`FORMATS`) is what the kernels' `blocks_mm` and the fused decode step
take per segment of a weight; `tile_bytes` is its size per 16 outputs.
"""

from __future__ import annotations

import torch

BLOCK, TILE, SUPER = 32, 16, 256
FORMATS = {"q4": 0, "q8": 1, "q4_k": 2, "q6_k": 3}  # as block_matmul.h's Format
Q4K_CHUNK = 8 * 256 + 128 + 128 + 32 + 32  # per tile and super-block: nibbles, sc, m, d, dmin
Q6K_CHUNK = 8 * 256 + 8 * 128 + 256 + 32  # nibbles, high bits, sc, d


def tile_bytes(format_code: int, in_features: int) -> int:
    """Bytes of one tile (16 outputs) of `format_code` over `in_features` inputs; ValueError where
    the format cannot take them (every format: multiples of 32; the K-quants: of 256)."""
    per_block = {0: 320, 1: 576}
    if format_code in per_block and in_features % BLOCK == 0:
        return in_features // BLOCK * per_block[format_code]
    per_super = {2: Q4K_CHUNK, 3: Q6K_CHUNK}
    if format_code in per_super and in_features % SUPER == 0:
        return in_features // SUPER * per_super[format_code]
    raise ValueError(f"block formats: format {format_code} takes no {in_features} inputs")


def _check(out_features: int, in_features: int) -> None:
    if out_features % TILE or in_features % SUPER or in_features <= 0:
        raise ValueError(
            f"k-quant packing: a [{out_features}, {in_features}] weight needs outputs in multiples of {TILE} "
            f"and inputs in multiples of {SUPER}"
        )


def _rows(values: torch.Tensor) -> torch.Tensor:
    """uint8 [out, in] -> [tiles, blocks, 8, 64]: per tile and block of 32, 8 rows of 16 outputs x 4 inputs."""
    out, cols = values.shape
    return values.view(out // TILE, TILE, cols // BLOCK, 8, 4).permute(0, 2, 3, 1, 4).reshape(out // TILE, -1, 8, 64)


def _unrows(rows: torch.Tensor, out: int, cols: int) -> torch.Tensor:
    return rows.reshape(out // TILE, cols // BLOCK, 8, TILE, 4).permute(0, 3, 1, 2, 4).reshape(out, cols)


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """Low 4 bits of q [out, in] as the Q4 chunks' 256 bytes per block: [tiles, super-blocks, 2048]."""
    rows = _rows(q & 0xF)
    return (rows[:, :, :4] | (rows[:, :, 4:] << 4)).reshape(rows.shape[0], -1, 2048)


def _per_tile(values: torch.Tensor, per_super: int) -> torch.Tensor:
    """[out, super-blocks * per_super] 1- or 2-byte values -> [tiles, super-blocks, bytes]: each
    super-block's values value-major, the tile's 16 outputs consecutive."""
    out, cols = values.shape
    sb = cols // per_super
    tiled = values.view(out // TILE, TILE, sb, per_super).permute(0, 2, 3, 1).contiguous()
    return tiled.view(torch.uint8).reshape(out // TILE, sb, -1)


def pack_q4k(q: torch.Tensor, sc: torch.Tensor, m: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor) -> torch.Tensor:
    """Q4_K: q 0..15 [out, in]; sc, m 0..63 [out, in / 32]; d, dmin float16 [out, in / 256]
    (w = (d * sc) * q - dmin * m) -> uint8 [out / 16, in / 256 * 2368]."""
    out, cols = q.shape
    _check(out, cols)
    parts = (
        _nibbles(q.to(torch.uint8)),
        _per_tile(sc.to(torch.uint8), 8),
        _per_tile(m.to(torch.uint8), 8),
        _per_tile(d.to(torch.float16), 1),
        _per_tile(dmin.to(torch.float16), 1),
    )
    return torch.cat(parts, dim=-1).reshape(out // TILE, -1).contiguous()


def pack_q6k(q: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Q6_K: q 0..63 [out, in]; sc int8 [out, in / 16]; d float16 [out, in / 256]
    (w = (d * sc) * (q - 32)) -> uint8 [out / 16, in / 256 * 3360]."""
    out, cols = q.shape
    _check(out, cols)
    q = q.to(torch.uint8)
    high = _rows(q >> 4)  # [tiles, blocks, 8, 64], values 0..3
    planes = [
        high[:, :, 4 * h] | high[:, :, 4 * h + 1] << 2 | high[:, :, 4 * h + 2] << 4 | high[:, :, 4 * h + 3] << 6
        for h in (0, 1)
    ]
    parts = (
        _nibbles(q),
        torch.stack(planes, dim=2).reshape(out // TILE, -1, 1024),
        _per_tile(sc.to(torch.int8), 16),
        _per_tile(d.to(torch.float16), 1),
    )
    return torch.cat(parts, dim=-1).reshape(out // TILE, -1).contiguous()


def _untile(chunks: torch.Tensor, start: int, per_super: int, dtype: torch.dtype, out: int) -> torch.Tensor:
    """`_per_tile`'s inverse for the bytes at [start, ...) of each chunk [tiles, super-blocks, chunk]."""
    width = per_super * TILE * torch.empty((), dtype=dtype).element_size()
    values = chunks[..., start : start + width].contiguous().view(dtype)  # [tiles, sb, per_super * 16]
    tiles, sb = values.shape[:2]
    return values.view(tiles, sb, per_super, TILE).permute(0, 3, 1, 2).reshape(out, sb * per_super)


def _q_low(chunks: torch.Tensor, out: int, cols: int) -> torch.Tensor:
    nibbles = chunks[..., :2048].reshape(chunks.shape[0], -1, 4, 64)
    return _unrows(torch.cat([nibbles & 0xF, nibbles >> 4], dim=2), out, cols)


def dequantize_q4k(packed: torch.Tensor, out: int, cols: int) -> torch.Tensor:
    """`pack_q4k`'s float32 [out, in] weights, as GGUF computes them."""
    _check(out, cols)
    chunks = packed.view(out // TILE, cols // SUPER, Q4K_CHUNK)
    groups = lambda t, n: t.float().repeat_interleave(n, 1)  # noqa: E731
    sc, m = _untile(chunks, 2048, 8, torch.uint8, out), _untile(chunks, 2176, 8, torch.uint8, out)
    d, dmin = _untile(chunks, 2304, 1, torch.float16, out), _untile(chunks, 2336, 1, torch.float16, out)
    step, offset = groups(d, 8) * sc.float(), groups(dmin, 8) * m.float()
    return groups(step, BLOCK) * _q_low(chunks, out, cols).float() - groups(offset, BLOCK)


def dequantize_q6k(packed: torch.Tensor, out: int, cols: int) -> torch.Tensor:
    """`pack_q6k`'s float32 [out, in] weights, as GGUF computes them."""
    _check(out, cols)
    chunks = packed.view(out // TILE, cols // SUPER, Q6K_CHUNK)
    planes = chunks[..., 2048:3072].reshape(chunks.shape[0], -1, 2, 1, 64)
    high = ((planes >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 1, 4, 1)) & 3).reshape(
        chunks.shape[0], -1, 8, 64
    )
    q = _q_low(chunks, out, cols) | (_unrows(high, out, cols) << 4)
    sc, d = _untile(chunks, 3072, 16, torch.int8, out), _untile(chunks, 3328, 1, torch.float16, out)
    step = d.float().repeat_interleave(16, 1) * sc.float()
    return step.repeat_interleave(16, 1) * (q.to(torch.int16) - 32).float()
