"""bfloat16 linear layers on the CPU with their weights packed for oneDNN once, at load time.

`F.linear` on a bf16 CPU tensor runs a oneDNN matmul that first reorders the weight into
oneDNN's blocked layout, on every call: for a decode step, which streams every weight once,
that reorder is a second pass over all the weights. Packing each weight once
(`torch.ops.mkldnn._reorder_linear_weight`, as `torch.compile` does for CPU inference) and
calling the packed matmul (`_linear_pointwise`) removes it; measured on SmolLM2's shapes
here (one thread), a 576x3072 projection went from ~270-440 us to ~180 us at one row and
from ~500 to ~320 us at 64 rows, with outputs equal to `F.linear`'s.

The packed copy is chosen for `BATCH_HINT` rows (oneDNN picks its blocking from it); 1
was slower at 64 rows and above, while 8 is as fast as any at 1 to 64 rows. Packed copies
live next to the plain weights (which the state dict, the weight digest and the embedding
lookup still read), so they must be rebuilt if the weights change. Anything else (float32,
CUDA, a torch without these ops) uses `F.linear` unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BATCH_HINT = 8


def _ops_available() -> bool:
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
        and ops._is_mkldnn_bf16_supported()
    )


def can_prepack(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and weight.dim() == 2 and _ops_available()


def prepack(weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy of a [out, in] weight, or None where the plain `F.linear` is used."""
    if not can_prepack(weight):
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BATCH_HINT)
    except RuntimeError:  # this torch's oneDNN refuses the weight: the plain path still works
        return None


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the packed copy when there is one."""
    if packed is None or x.dtype != torch.bfloat16:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
