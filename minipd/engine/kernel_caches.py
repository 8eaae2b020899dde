"""Bounded per-shape kernel caches: an engine's memory must not grow with every prompt length.

torch's bfloat16 matmuls on the CPU (`F.linear` and the prepacked `_linear_pointwise` of
`models/weights/prepacked_linear.py`) run oneDNN primitives, built for one exact input shape, and two
caches keep each one built: ideep's computation cache (`LRU_CACHE_CAPACITY`) and oneDNN's
primitive cache (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`), 1,024 entries each by default. A step
of M tokens builds one primitive per distinct weight shape (qkv, o, gate-up, down, and the
LM head for its sampled rows), so every distinct step size adds about five entries that are
never given back. Measured (one thread, `--model small`, bf16): 200 prompts of distinct
lengths took an engine from 491 to 986 MB; bounding oneDNN's cache alone left 780 MB, and
bounding both to 64 entries, 562 MB. A single 576x1536 projection over 200 row counts grew
138 MB with the default caches, 76 MB with oneDNN's alone bounded (to 0), and 2-5 MB with
both bounded (ideep's to 1, oneDNN's to 8).
float32 matmuls and the 4-bit kernel (`models/weights/quantized_linear.py`) build no per-shape
state; their growth was under 20 MB.

`CAPACITY` entries per cache keep the primitives of about a dozen step sizes: a step's
layers share them (all layers have the same shapes), so a step of a size not kept rebuilds
about five primitives, once, and its other layers reuse them. Measured on dense bf16 SmolLM2
(one thread), prompts of 100 distinct lengths served over and over, so that every prefill
missed the bounded caches while the default ones held every shape: 24.2 ms of CPU per prefill
bounded against 24.8 ms unbounded (medians of alternating processes, within the noise), and
`bench.py engine --parts serving` 34.0 tok/s against 33.9.

Each cache reads its capacity once, when it is first used (measured: setting the variables
after `import torch` but before the first bf16 matmul takes effect), so `bound()` runs at
the top of `Engine.__init__`, before the model loads (loading prepacks weights through
oneDNN). A process that ran a bf16 matmul before its first engine keeps what it had; a value
the user set is kept. This module must not import torch.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

CAPACITY = 64
CAPACITY_ENV = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def bounded_env(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """`env` with each cache's capacity added where the user set none; returns `env`."""
    for name in CAPACITY_ENV:
        env.setdefault(name, str(CAPACITY))
    return env


def bound() -> None:
    """Bound this process's kernel caches (effective if no bf16 matmul ran here yet)."""
    bounded_env(os.environ)
