"""KV-cache transports: move layers of KV blocks from one instance's pool into blocks another
instance reserved. Start at `base.Transport` (the contract) and `registry.create_transport`."""

from minipd.transports.base import Transport
from minipd.transports.block_run import BlockRun, coalesce_runs
from minipd.transports.errors import TransferError
from minipd.transports.registry import MissingBackendError, available_transports, create_transport
from minipd.transports.results import LayerWritten, ReceiveOutcome, RequestLanded, RequestSent

__all__ = [
    "BlockRun",
    "LayerWritten",
    "MissingBackendError",
    "ReceiveOutcome",
    "RequestLanded",
    "RequestSent",
    "TransferError",
    "Transport",
    "available_transports",
    "coalesce_runs",
    "create_transport",
]
