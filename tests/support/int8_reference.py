"""What minipd's int8 kernels promise for y = x @ w.T (models/kernels/vnni_kernels.cpp, kquant_tiles.h),
as a float64 model for the kernel tests: x rounded to int8 per block of 32 as the kernels round it,
times the file's weights exactly; each output within float32 summation of that (and one bfloat16
step for bfloat16 outputs), and the rounding's own effect small but not nothing."""

from __future__ import annotations

import torch


def int8_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels round it, per block of 32, in float32: dx = max|x| / 127, q = x * (1 / dx)
    to nearest even; returned as float64 q * dx."""
    blocks = x.float().view(x.shape[0], -1, 32)
    dx = blocks.abs().amax(-1, keepdim=True) / 127
    qx = (blocks * torch.where(dx > 0, 1 / dx, 0)).round().clamp(-127, 127)
    return (qx.double() * dx.double()).view_as(x)


def assert_int8_product(y: torch.Tensor, x: torch.Tensor, weights: torch.Tensor) -> None:
    """y (x's dtype) is the int8-rounded x times `weights` (float32 [out, in]) within float32
    summation (plus one bfloat16 step, 2^-8 relative, for bfloat16), and moves from the exact
    product by more than nothing and less than 2% of its norm."""
    xq = int8_activations(x)
    model = xq @ weights.double().t()
    scale = xq.abs() @ weights.double().abs().t()
    step = 2.0**-8 if y.dtype == torch.bfloat16 else 0.0
    assert ((y.double() - model).abs() <= model.abs() * step + scale * 1e-6).all()
    exact = x.double() @ weights.double().t()
    relative = ((y.double() - exact).norm() / exact.norm()).item()
    assert 0 < relative < 0.02, f"int8 activations move the outputs by {relative:.4f} of their norm"
