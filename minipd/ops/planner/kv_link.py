"""The KV link out of a prefill instance: when the KV of a prefill step has landed on decode.

One link per prefill instance (its NIC), used by one transfer at a time in step order. A
step of compute `C` writes KV for `L` layers; sending it takes `T = bytes / bandwidth`.

- Layer-wise (minipd's default): layer i is sent as soon as it is written, while layer i+1
  computes. With the link free when the step starts, the last byte lands at
  `max(end + T/L, start + C/L + T)`: only one layer's share is exposed when the link keeps
  up (`T <= C`), else the part of `T` that the compute cannot cover. A link still busy
  with an earlier step's KV (`link_free_at`) pushes the whole pipeline back.
- After prefill: the whole KV goes once the step ends, `max(end, link_free_at) + T`.
Every transfer then pays `setup_s` (descriptors, notification, completion), exposed.
"""

from __future__ import annotations

import math

import msgspec


class KVLink(msgspec.Struct, frozen=True):
    gbps: float = math.inf  # Gbit/s
    setup_s: float = 0.0
    layerwise: bool = True
    num_layers: int = 1

    def __post_init__(self) -> None:
        if not self.gbps > 0:
            raise ValueError(f"link_gbps: must be positive, got {self.gbps}")
        if not (self.setup_s >= 0 and math.isfinite(self.setup_s)):
            raise ValueError(f"link setup: must be finite and >= 0, got {self.setup_s}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers: must be >= 1, got {self.num_layers}")

    def transfer_s(self, num_bytes: float) -> float:
        """Seconds to move `num_bytes` over the link, setup excluded."""
        return 0.0 if math.isinf(self.gbps) else num_bytes * 8 / (self.gbps * 1e9)

    def done_s(self, step_start: float, step_end: float, link_free_at: float, num_bytes: float) -> float:
        """When the last byte of a step's KV has landed (setup included)."""
        t = self.transfer_s(num_bytes)
        if self.layerwise:
            compute = step_end - step_start
            done = max(link_free_at + t, step_start + compute / self.num_layers + t, step_end + t / self.num_layers)
        else:
            done = max(link_free_at, step_end) + t
        return done + self.setup_s

    def exposed_s(self, num_bytes: float, compute_s: float) -> float:
        """Transfer time left after the compute ends, on an idle link."""
        return self.done_s(0.0, compute_s, 0.0, num_bytes) - compute_s
