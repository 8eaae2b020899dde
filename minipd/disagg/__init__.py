"""Prefill/decode instances: an engine, its KV transport and its control-plane server.

Imports `minipd.engine`, `minipd.control` and `minipd.transports`; never the router, the HTTP
API or the command line.
"""
