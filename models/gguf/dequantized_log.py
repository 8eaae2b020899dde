"""The log line naming a GGUF's weight matrices that were stored quantized but are served dense.

minipd's int8 kernels read Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K (gguf_quantized.py,
kquant_segments.py; torch's kernel Q4_0/Q4_1 only); every other quantized type (Q5_1, Q5_K) is
dequantized to the model's dtype when it loads, at four times a 4-bit file's memory in bfloat16.
`log_dequantized` says which, compactly (`Q5_K: attn_q, ffn_up (blk 0-27); Q6_K: output`): a
warning where a type no kernel reads is among them or where the weights were asked to stay
quantized, else (a dense load of types a kernel reads, as asked) at info level. The embedding
table is left out: it is looked up, not multiplied.
"""

from __future__ import annotations

import logging
from typing import Iterable

import torch
from gguf import GGMLQuantizationType

from minipd.models.gguf.gguf_dequantize import FLOAT_TYPES
from minipd.models.gguf.gguf_file import GGUFFile, GGUFTensorInfo

log = logging.getLogger(__name__)

KERNEL_TYPES = tuple(GGMLQuantizationType[name] for name in ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"))
_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
_LAYER_PREFIX = "blk."


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    spans: list[list[int]] = []
    for i in sorted(indices):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def summarize(infos: Iterable[GGUFTensorInfo]) -> str:
    """Tensors grouped by type (by name), then by role (those in layers first), each role's layers as ranges:
    "Q4_K: attn_q, ffn_up (blk 0-27); ffn_down (blk 0-3, 6) | Q6_K: output"."""
    by_type: dict[str, dict[str, list[int]]] = {}
    for info in infos:
        roles = by_type.setdefault(info.type_name, {})
        if info.name.startswith(_LAYER_PREFIX):
            index, _, role = info.name[len(_LAYER_PREFIX) :].partition(".")
            roles.setdefault(role.removesuffix(".weight"), []).append(int(index))
        else:
            roles.setdefault(info.name.removesuffix(".weight"), [])
    parts = []
    for type_name, roles in sorted(by_type.items()):
        same_layers: dict[tuple[int, ...], list[str]] = {}
        for role, layers in roles.items():
            same_layers.setdefault(tuple(layers), []).append(role)
        in_layers_first = sorted(same_layers.items(), key=lambda item: not item[0])
        groups = [", ".join(r) + (f" (blk {_ranges(list(ls))})" if ls else "") for ls, r in in_layers_first]
        parts.append(f"{type_name}: " + "; ".join(groups))
    return " | ".join(parts)


def is_weight_matrix(name: str) -> bool:
    """A projection or the untied lm_head: what a quantized kernel could multiply."""
    if name == "output.weight":
        return True
    if not name.startswith(_LAYER_PREFIX):
        return False
    role = name[len(_LAYER_PREFIX) :].partition(".")[2]
    return role.removesuffix(".weight") in _MATRICES and role.endswith(".weight")


def log_dequantized(file: GGUFFile, dense_names: Iterable[str], weights: str, dtype: torch.dtype) -> None:
    """Log the weight matrices among `dense_names` (GGUF names just loaded dense) that the file
    stores in a quantized type; nothing when there are none."""
    dequantized = [
        file.tensors[n] for n in dense_names if is_weight_matrix(n) and file.tensors[n].ggml_type not in FLOAT_TYPES
    ]
    if not dequantized:
        return
    without_kernel = any(info.ggml_type not in KERNEL_TYPES for info in dequantized)
    total = sum(1 for n in file.tensors if is_weight_matrix(n))
    if without_kernel:
        why = "no quantized kernel reads these types; minipd's read Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K"
    elif weights != "dense":
        why = f"weights {weights}: their type or group has no quantized kernel here"
    else:
        why = "weights dense"
    level = logging.WARNING if without_kernel or weights != "dense" else logging.INFO
    dtype_name = str(dtype).removeprefix("torch.")
    log.log(
        level,
        "gguf %s: %d of %d weight matrices dequantized to %s (%s): %s",
        file.path.name,
        len(dequantized),
        total,
        dtype_name,
        why,
        summarize(dequantized),
    )
