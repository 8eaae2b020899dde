"""Which rows of a step's input multiply a `QuantizedLinear`'s dense copy (quantized_linear.py):
the `RowSplit` a step builds (model_runner.py) and each projection reads, and the row count
from which the dense copy is the faster (`DENSE_MIN_ROWS`)."""

from __future__ import annotations

from typing import NamedTuple

import torch

# The crossover: rows from which the dense copy is faster, so prompts of this many tokens on
# prefill through it (model_runner.py; per prompt, not per chunk). SmolLM2-135M's projections (one
# thread, prepacked bf16, median ms per layer over 30 distinct layers, int4 / dense):
#   rows     1          2          4          8          16         32         64         512
#   qkv      .032/.064  .040/.064  .055/.066  .107/.066  .202/.070  .391/.070  .791/.090  6.24/.376
#   o        .022/.051  .026/.044  .036/.044  .063/.046  .123/.046  .244/.051  .481/.062  3.79/.237
#   gate_up  .119/.216  .136/.208  .186/.204  .348/.214  .664/.230  1.29/.288  2.54/.372  20.1/1.28
#   down     .055/.111  .065/.093  .087/.096  .168/.099  .340/.135  .650/.125  1.29/.189  10.3/.670
# (qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536.)
# int4 is 0.5x dense at 1 row, 0.8-0.9x at 4 and 1.4-1.7x at 8, 15x at 512: every shape
# crosses between 4 and 8 rows. Dequantizing per use instead of keeping the copy costs 2.3 ms
# for gate_up alone, more than its dense 512-row matmul (1.28 ms).
DENSE_MIN_ROWS = 8


class RowSplit(NamedTuple):
    """Which rows of a step's [rows, in] input a `QuantizedLinear` with a dense copy multiplies
    densely: `dense` holds [start, stop) row ranges, each multiplied alone (a dense bf16 matmul's
    row results depend on how many rows it is given, so a segment's result must not depend on
    which other segments share the step); `rest` the other rows, multiplied together by the
    int4 kernel (whose rows are independent), as a slice, an index tensor, or None for none."""

    dense: tuple[tuple[int, int], ...]
    rest: slice | torch.Tensor | None

    @classmethod
    def of(cls, dense: list[tuple[int, int]], num_rows: int) -> RowSplit:
        """The split of `num_rows` rows whose `dense` ranges are disjoint and ascending."""
        if not dense:
            return cls((), slice(0, num_rows))
        rest: list[int] = []
        previous = 0
        for start, stop in dense:
            rest.extend(range(previous, start))
            previous = stop
        rest.extend(range(previous, num_rows))
        if not rest:
            return cls(tuple(dense), None)
        if rest[-1] - rest[0] + 1 == len(rest):
            return cls(tuple(dense), slice(rest[0], rest[-1] + 1))
        return cls(tuple(dense), torch.tensor(rest, dtype=torch.long))
