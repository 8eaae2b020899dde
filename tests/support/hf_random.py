"""Random weights for tiny transformers checkpoints that make parity tests sensitive."""

from __future__ import annotations

import torch


def sharpen(model: torch.nn.Module) -> None:
    """Overwrite `model`'s parameters in place: norms near 1, biases O(1), matrices fan-in scaled.
    HF's init (std 0.02) makes attention nearly uniform, which would hide RoPE and bias bugs;
    these give sharp attention and O(1) logits. Draws from torch's global generator."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.5 * torch.randn_like(param))
            else:
                param.copy_(2 * torch.randn_like(param) * param.shape[-1] ** -0.5)
