"""The engine core of one instance: model, paged KV pool, scheduler, sampling, streaming.

Imports only `minipd.models` (and torch); knows nothing of roles, networks or HTTP. The
disaggregation layer reaches into it through one seam, `kv_sink.KVSink`.
"""
