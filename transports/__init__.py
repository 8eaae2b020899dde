"""KV-cache transports: move layers of KV blocks from one instance's pool into blocks another
instance reserved. Start at `base.Transport` (the contract) and `registry.create_transport`."""

from minipd.transports.backends import MissingBackendError, available_transports, create_transport
from minipd.transports.base import Transport
from minipd.transports.block_run import BlockRun, coalesce_runs
from minipd.transports.results import LayerWritten, ReceiveOutcome, RequestLanded, RequestSent
from minipd.transports.transfer_error import TransferError

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
