"""Input embeddings looked up in the Q8_0 blocks that a tied lm_head already reads.

A tied model's token table is its lm_head: with minipd's int8 kernels (kernels/vnni_kernels.py) the
lm_head multiplies the file's Q8_0 blocks, so a dense copy of the table kept only for the
input lookups would be the largest tensor in memory (SmolLM2: 113 MB in float32, 57 MB in
bfloat16, against 31.9 MB of blocks). `BlockEmbedding` reads each looked-up row from the
packed blocks instead: q * d in float32, exactly GGUF's dequantization, then the model's
dtype, so a row equals the dense table's row bit for bit (the table is that dequantization in
the dtype). A step reads one row of ~600 bytes per token.

It is no parameter and holds no buffer: the blocks are the lm_head's, in its state dict once.
"""

from __future__ import annotations

import torch
from torch import nn

from minipd.models.kernels import vnni_kernels
from minipd.models.kernels.kquant_packing import FORMATS
from minipd.models.weights.quantized_linear import QuantizedLinear


class BlockEmbedding(nn.Module):
    """`nn.Embedding`'s lookup (ids [T] -> [T, hidden] in `dtype`) from a Q8_0 `QuantizedLinear`'s blocks."""

    def __init__(self, blocks: QuantizedLinear, dtype: torch.dtype):
        super().__init__()
        if blocks.formats != (FORMATS["q8"],) or blocks.kernel not in vnni_kernels.VARIANTS:
            raise ValueError("block embedding: needs Q8_0 blocks packed for minipd's int8 kernels")
        self._blocks = [blocks]  # a list: not a sub-module, so its buffer is not in this state dict twice
        self.num_embeddings, self.embedding_dim, self.dtype = blocks.out_features, blocks.in_features, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        blocks = self._blocks[0]
        rows = vnni_kernels.q8_rows(blocks.packed, ids.reshape(-1), blocks.in_features, self.dtype, blocks.kernel)
        return rows.view(*ids.shape, self.embedding_dim)

    @property
    def nbytes(self) -> int:
        return 0  # the lm_head's blocks, counted there
