"""What a model's weights are served as, from its `QuantizedLinear` modules: the format name the
engine and the fingerprint carry, and the start-up line's description of it."""

from __future__ import annotations

from minipd.models.weights.quantized_linear import QuantizedLinear


def weights_format(quantized: list[QuantizedLinear], lm_head: QuantizedLinear | None) -> str:
    """ "mixed" when the quantized projections also hold dense copies, "quantized" when any is
    served from its blocks only, else "dense". A quantized lm_head (a tied one reads the
    embedding's 8-bit blocks) needs no dense copy: it multiplies few rows, so the projections decide."""
    if not quantized:
        return "dense"
    projections = [m for m in quantized if m is not lm_head] or quantized
    return "mixed" if all(m.has_dense for m in projections) else "quantized"


def describe(quantized: list[QuantizedLinear], lm_head: QuantizedLinear | None) -> str:
    """The format and, for quantized weights, their memory, their dense copies' and the kernel, e.g.
    "mixed (4-bit projections 66.4 MB + dense copy 212.3 MB, 8-bit lm_head 31.9 MB; kernel vnni)"."""
    name = weights_format(quantized, lm_head)
    if not quantized:
        return name
    four_bit = sum(m.nbytes for m in quantized if m.bits == 4 and m is not lm_head) / 1e6
    wider = sum(m.nbytes for m in quantized if m.bits == 6 and m is not lm_head) / 1e6
    dense_copies = sum(m.dense_nbytes for m in quantized)
    copy = f" + dense copy {dense_copies / 1e6:.1f} MB" if dense_copies else ", no dense copy"
    six_bit = f", with 6-bit blocks {wider:.1f} MB" if wider else ""
    head = ""
    if lm_head is not None and lm_head.kernel != "torch":
        head = f", {lm_head.bits}-bit lm_head {lm_head.nbytes / 1e6:.1f} MB"
    return f"{name} (4-bit projections {four_bit:.1f} MB{six_bit}{copy}{head}; kernel {quantized[0].kernel})"
