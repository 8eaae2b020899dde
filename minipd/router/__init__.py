"""The router of a disaggregated cluster: instance registry and picking, the request lifecycle
across instances, its control port, and the Python client for it.

Imports `minipd.engine` (types only), `minipd.control`; never `minipd.disagg`'s instances, the
HTTP API or the command line.
"""
