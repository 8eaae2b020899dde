"""minipd: a small prefill/decode disaggregated LLM serving engine.

The public Python API (imported lazily, so `import minipd.transports` stays light):

    from minipd import Engine, EngineConfig, SamplingParams
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Engine": "minipd.engine",
    "EngineConfig": "minipd.engine",
    "EngineStats": "minipd.engine",
    "SamplingParams": "minipd.sampling_params",
    "InvalidRequestError": "minipd.sampling_params",
    "RequestOutput": "minipd.request",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'minipd' has no attribute {name!r}")
