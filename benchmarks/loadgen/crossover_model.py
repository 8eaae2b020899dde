"""The crossover of disaggregation: where the KV transfer it adds to a prompt's TTFT equals the
prefill interference it removes from the decodes running beside that prompt.

Measured side:
- interference I(P): on a colocated instance, the time one running decode stream loses while a
  prompt of P tokens is prefilled: the sum, over its token gaps that overlap the prefill, of
  each gap minus the stream's undisturbed gap (`stall_s`);
- transfer cost dT(B): on a disaggregated pair whose KV link runs at B, the prompt's TTFT
  minus its TTFT on an unlimited link;
- crossover: the B at which dT(B) = I(P), going from generous to starved, interpolated
  linearly in 1/B, the transfer time (`measured_crossover_gbps`).

Model side (`model_crossover_gbps`): the KV of P tokens, K bytes, streams layer by layer
while prefill (compute time C over L layers) runs: the first layer's KV is ready after C/L,
so on a link of B bytes/s the last byte lands at max(C + K/(L*B), C/L + K/B), and the
exposed part is max(K/(L*B), K/B - C*(L-1)/L). The interference it is set against is C minus
the decode steps the stream still gets, one per prefill chunk (`model_interference_s`).
Solving exposed(B) = I gives B = max(K / (I + C*(L-1)/L), K / (L*I)).
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

BITS_PER_BYTE = 8
GIGA = 1e9


def exposed_transfer_s(kv_bytes: float, gbps: float, prefill_s: float, num_layers: int) -> float:
    """Seconds of KV transfer left after prefill compute ends, with layer-wise streaming."""
    transfer_s = kv_bytes * BITS_PER_BYTE / (gbps * GIGA)
    return max(transfer_s / num_layers, transfer_s - prefill_s * (num_layers - 1) / num_layers)


def model_interference_s(prefill_s: float, prompt_len: int, chunk_tokens: int, decode_gap_s: float) -> float:
    """What a decode stream loses to a colocated prefill: its compute time, less one ordinary
    decode step per prefill chunk (each chunk's step still carries the stream's token)."""
    num_chunks = math.ceil(prompt_len / chunk_tokens)
    return max(0.0, prefill_s - num_chunks * decode_gap_s)


def model_crossover_gbps(kv_bytes: float, prefill_s: float, interference_s: float, num_layers: int) -> float:
    """The bandwidth at which `exposed_transfer_s` equals `interference_s` (inf if it is 0)."""
    if interference_s <= 0:
        return math.inf
    overlap_s = prefill_s * (num_layers - 1) / num_layers
    bytes_per_s = max(kv_bytes / (interference_s + overlap_s), kv_bytes / (num_layers * interference_s))
    return bytes_per_s * BITS_PER_BYTE / GIGA


def stall_s(stream_times: Sequence[float], start: float, end: float, undisturbed_gap_s: float) -> float:
    """Time a stream whose events came at `stream_times` (sorted) lost in [start, end]: over
    the gaps that overlap the window, each gap's excess over `undisturbed_gap_s`."""
    first = max(1, bisect.bisect_right(stream_times, start))  # the first event after the window opens
    lost = 0.0
    for k in range(first, len(stream_times)):
        if stream_times[k - 1] >= end:
            break
        lost += max(0.0, stream_times[k] - stream_times[k - 1] - undisturbed_gap_s)
    return lost


def measured_crossover_gbps(
    link_gbps: Sequence[float], extra_ttft_s: Sequence[float], interference_s: float
) -> float | None:
    """The first bandwidth, going from generous to starved, at which the extra TTFT reaches
    `interference_s`, interpolated in 1/bandwidth from an unlimited link (extra TTFT 0 at
    1/B = 0); None when it never does within the sweep."""
    points = [(0.0, -interference_s)] + sorted((1 / g, t - interference_s) for g, t in zip(link_gbps, extra_ttft_s))
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if y1 >= 0 > y0:
            x = x0 + (x1 - x0) * (-y0) / (y1 - y0)
            return math.inf if x == 0 else 1 / x
    return None
