"""minipd: a small prefill/decode disaggregated LLM serving engine.

The public Python API (imported lazily, so `import minipd.transports` stays light):

    from minipd import Engine, EngineConfig, SamplingParams        # one engine in your program
    from minipd import InProcessCluster                            # a whole cluster in your program
    from minipd import ClusterClient                               # a client of a running cluster

The package is layered (see docs/architecture.md); these names are its public surface.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Engine": "minipd.engine.engine",
    "EngineConfig": "minipd.engine.engine",
    "EngineStats": "minipd.engine.engine",
    "SamplingParams": "minipd.engine.sampling_params",
    "InvalidRequestError": "minipd.engine.sampling_params",
    "RequestOutput": "minipd.engine.request",
    "InProcessCluster": "minipd.entrypoints.inprocess_cluster",
    "ClusterClient": "minipd.router.cluster_client",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'minipd' has no attribute {name!r}")
