"""minipd's own CPU kernels for GGUF's quantized blocks (`vnni_kernels.cpp`), prebuilt at install
or built at first use.

Why a kernel of our own: torch's `_weight_int4pack_mm_for_cpu` dequantizes every weight to
float for every few rows it multiplies, so at a batch of 8 a 4-bit projection costs 3.4x what
it does at one row, and the only 8-bit kernel, `_weight_int8pack_mm`, has per-channel scales
that cannot hold Q8_0's per-block ones. These kernels quantize the activations to int8 per
block of 32 and take integer dot products (as llama.cpp's CPU path does), so the weights, held
exactly as the file stores them, are never dequantized; what each output depends on is stated
in the .cpp's header (its row of x and its row of w only).

The same source builds for two instruction sets (`VARIANTS`), each a kernel of its own name:
"vnni" (AVX-512 VNNI and BF16: 16 outputs per instruction) and "avx2" (AVX2, FMA and F16C,
for CPUs without AVX-512: `vpmaddubsw` on two halves of each tile). Both compute the same
integers and the same float32 steps, so they give the same bits; both take bfloat16 or float32
activations and answer in the same dtype.

`unavailable(variant)` says why a variant cannot be used here (not x86-64 Linux, a CPU without
the instructions, no C++ compiler, a failed build), else None; `best()` names the fastest that
runs; `load(variant)` registers its ops (`torch.ops.minipd_<variant>`) from a library found or
built once per process:
1. the prebuilt one the install built for these sources and this torch (`kernel_build.prebuild`,
   run by setup.py; in `MINIPD_KERNEL_PREBUILT`, by default the package's `prebuilt/`), which
   needs no compiler; a stale one (another source or torch) is not found, one that fails to load
   is passed over with a warning;
2. else the cache's, built at first use with a warning (about 20 s; once per source, torch,
   compiler and flags; under `MINIPD_KERNEL_CACHE`, by default `~/.cache/minipd/kernels`;
   concurrent processes wait on a lock for the first build).
`pack_q4` / `pack_q8` lay weights out as the kernels read them (one layout for both variants);
the K-quants' layouts are kquant_packing.py's, and `blocks_mm` multiplies a weight made of
segments of any of these formats (q/k/v of a Q4_K_M file: Q4_K, Q4_K, Q6_K).
The build itself (variants, flags, g++) is `kernel_build`.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from minipd.models.kernels import kernel_build
from minipd.models.kernels.cpu_flags import read_cpu_flags
from minipd.models.kernels.kernel_build import VARIANTS, compile_library, find_compiler

BLOCK = 32  # GGUF's block of weights, and of activations the kernels quantize together
TILE = 16  # outputs per packed chunk; out_features must be a multiple
Q4_CHUNK = 256 + 32 + 32  # bytes per tile and block: nibbles, d, m
Q8_CHUNK = 512 + 32 + 32  # int8 weights, d, block sums
log = logging.getLogger(__name__)


def cache_dir() -> Path:
    if configured := os.environ.get("MINIPD_KERNEL_CACHE"):
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minipd" / "kernels"


def _build(compiler: str, library: Path, variant: str) -> None:
    library.parent.mkdir(parents=True, exist_ok=True)
    with open(library.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds; the others wait, then load its result
        if library.exists():
            return
        log.warning(
            "building minipd's %s CPU kernels with %s (no prebuilt library for these sources and this torch: "
            "about 20 s, once; cached at %s)",
            variant,
            compiler,
            library,
        )
        with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
            output = Path(tmp) / library.name
            compile_library(compiler, output, variant)
            os.replace(output, library)  # atomic: nobody loads a half-written library


def _load_prebuilt(variant: str) -> bool:
    """Register `variant`'s ops from its prebuilt library; False when there is none or it fails to load."""
    library = kernel_build.prebuilt_library(variant)
    if library is None:
        return False
    try:
        torch.ops.load_library(str(library))
    except (OSError, RuntimeError) as e:
        log.warning("minipd's prebuilt %s kernels (%s) did not load, so they are built: %s", variant, library, e)
        return False
    return True


@functools.cache
def _load(variant: str) -> str | None:
    """Load (the prebuilt library) or build (into the cache) and register `variant`'s ops; returns why
    that failed, or None."""
    if variant not in VARIANTS:
        raise ValueError(f"minipd kernels: unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if (why := kernel_build.builds_here()) is not None:
        return why
    flags = read_cpu_flags() or frozenset()
    missing = [f for f in VARIANTS[variant].cpu_flags if f not in flags]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    if _load_prebuilt(variant):
        return None
    compiler = find_compiler()
    if compiler is None:
        return f"no C++ compiler (g++ or $CXX) to build the {variant} kernels, and no prebuilt library"
    try:
        library = cache_dir() / f"{variant}_kernels-{kernel_build.cache_key(variant, compiler)}.so"
        if not library.exists():
            _build(compiler, library, variant)
        torch.ops.load_library(str(library))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return f"the {variant} kernels could not be built or loaded: {e}"
    return None


def unavailable(variant: str = "vnni") -> str | None:
    """Why `variant`'s kernels cannot run in this process (building them on the first call), or None."""
    return _load(variant)


def why_none() -> str:
    """Why each variant cannot run here, in one line (for when none does)."""
    return "; ".join(f"{v}: {_load(v)}" for v in VARIANTS)


def best() -> str | None:
    """The fastest variant that runs here (building it), or None when none does."""
    return next((v for v in VARIANTS if _load(v) is None), None)


def load(variant: str = "vnni") -> None:
    """Build (once) and register `variant`'s ops, or raise RuntimeError saying why they cannot be."""
    if (why := _load(variant)) is not None:
        raise RuntimeError(why)


def _ops(variant: str):
    load(variant)  # cached after the first call
    return getattr(torch.ops, f"minipd_{variant}")


def _check(out_features: int, in_features: int) -> None:
    if out_features % TILE or in_features % BLOCK or in_features <= 0:
        raise ValueError(
            f"vnni kernels: a [{out_features}, {in_features}] weight needs outputs in multiples of {TILE} "
            f"and inputs in multiples of {BLOCK}"
        )


def _tiles(values: torch.Tensor, per_block: int) -> torch.Tensor:
    """[out, in / 32 * per_block] -> [out / 16, in / 32, 8, 16 * per_block / 8]: each tile's and
    block's weights as 8 rows of 16 outputs x (per_block / 8) consecutive values."""
    out, cols = values.shape
    blocks = cols // per_block
    return (
        values.view(out // TILE, TILE, blocks, 8, per_block // 8)
        .permute(0, 2, 3, 1, 4)
        .reshape(out // TILE, blocks, 8, TILE * per_block // 8)
    )


def _per_tile(values: torch.Tensor) -> torch.Tensor:
    """[out, blocks] of 2-byte values -> [out / 16, blocks, 32] bytes: each tile's 16 per block."""
    out, blocks = values.shape
    return values.view(out // TILE, TILE, blocks).transpose(1, 2).contiguous().view(torch.uint8)


def pack_q4(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """q: 0..15 [out, in]; d, m: float16 [out, in / 32] (w = d * q + m) -> uint8 [out / 16, in / 32 * 320]."""
    _check(*q.shape)
    rows = _tiles(q.to(torch.uint8), BLOCK)  # [tiles, blocks, 8, 64]
    nibbles = rows[:, :, :4] | (rows[:, :, 4:] << 4)
    tiles, blocks = nibbles.shape[:2]
    parts = (nibbles.reshape(tiles, blocks, 256), _per_tile(d.to(torch.float16)), _per_tile(m.to(torch.float16)))
    return torch.cat(parts, dim=-1).reshape(tiles, blocks * Q4_CHUNK).contiguous()


def pack_q8(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """q: int8 [out, in]; d: float16 [out, in / 32] (w = d * q) -> uint8 [out / 16, in / 32 * 576]."""
    _check(*q.shape)
    out, cols = q.shape
    rows = _tiles(q.to(torch.int8).view(torch.uint8), BLOCK)
    tiles, blocks = rows.shape[:2]
    sums = q.to(torch.int32).view(out, cols // BLOCK, BLOCK).sum(-1).to(torch.int16)
    parts = (rows.reshape(tiles, blocks, 512), _per_tile(d.to(torch.float16)), _per_tile(sums))
    return torch.cat(parts, dim=-1).reshape(tiles, blocks * Q8_CHUNK).contiguous()


def q4_mm(x: torch.Tensor, packed: torch.Tensor, in_features: int, variant: str = "vnni") -> torch.Tensor:
    """x (bfloat16 or float32 [rows, in]) @ w.T for `pack_q4`'s weights: [rows, out] in x's dtype."""
    return _ops(variant).q4_mm(x, packed, in_features)


def q8_mm(x: torch.Tensor, packed: torch.Tensor, in_features: int, variant: str = "vnni") -> torch.Tensor:
    """x (bfloat16 or float32 [rows, in]) @ w.T for `pack_q8`'s weights: [rows, out] in x's dtype."""
    return _ops(variant).q8_mm(x, packed, in_features)


def blocks_mm(
    x: torch.Tensor,
    packed: torch.Tensor,
    in_features: int,
    formats: tuple[int, ...],
    outs: tuple[int, ...],
    variant: str = "vnni",
) -> torch.Tensor:
    """x (bfloat16 or float32 [rows, in]) @ w.T for a weight of segments stacked along the outputs:
    segment s has `outs[s]` outputs in format `formats[s]` (kquant_packing.FORMATS: `pack_q4`,
    `pack_q8`, `kquant_packing.pack_q4k`, `pack_q6k`), their bytes in order in `packed` (any
    contiguous uint8 tensor): [rows, sum(outs)] in x's dtype. A segment's outputs are what its own
    format's kernel gives (block_matmul.h)."""
    return _ops(variant).blocks_mm(x, packed, in_features, list(formats), list(outs))


def q8_rows(packed: torch.Tensor, ids: torch.Tensor, in_features: int, dtype: torch.dtype, variant: str = "vnni"):
    """Rows `ids` (int64 [n]) of `pack_q8`'s weights as GGUF dequantizes them, in `dtype`
    (float32 or bfloat16): [n, in]. RuntimeError for an id past the rows."""
    return _ops(variant).q8_rows(packed, ids, in_features, dtype)


def _untile(rows: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """`_tiles`'s inverse for blocks of 32: [tiles, blocks, 8, 64] -> [out, in]."""
    tiles, blocks = rows.shape[:2]
    return rows.reshape(tiles, blocks, 8, TILE, 4).permute(0, 3, 1, 2, 4).reshape(out_features, in_features)


def _untile_scales(chunks: torch.Tensor, start: int, dtype: torch.dtype, out_features: int) -> torch.Tensor:
    tiles, blocks = chunks.shape[:2]
    values = chunks[..., start : start + 32].contiguous().view(dtype)  # [tiles, blocks, 16]
    return values.transpose(1, 2).reshape(out_features, blocks)


def dequantize(packed: torch.Tensor, out_features: int, in_features: int, bits: int) -> torch.Tensor:
    """The float32 [out, in] weights packed by `pack_q4` (bits 4) or `pack_q8` (bits 8), computed
    as GGUF dequantizes them (d * q + m; d * q)."""
    _check(out_features, in_features)
    blocks = in_features // BLOCK
    chunks = packed.view(out_features // TILE, blocks, Q8_CHUNK if bits == 8 else Q4_CHUNK)
    groups = lambda t: t.float().repeat_interleave(BLOCK, 1)  # noqa: E731
    d = _untile_scales(chunks, 512 if bits == 8 else 256, torch.float16, out_features)
    if bits == 8:
        values = chunks[..., :512].contiguous().view(torch.int8).view(*chunks.shape[:2], 8, 64)
        q = _untile(values, out_features, in_features)
        return q.float() * groups(d)
    nibbles = chunks[..., :256].reshape(*chunks.shape[:2], 4, 64)
    q = _untile(torch.cat([nibbles & 0xF, nibbles >> 4], dim=2), out_features, in_features)
    return q.float() * groups(d) + groups(_untile_scales(chunks, 288, torch.float16, out_features))
