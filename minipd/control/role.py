"""What a minipd process is, and what an instance does: the one `Role` type.

Instances announce their role in the handshake (`Welcome.role`) and in their stats; the
command line picks a process's role with `--role`; the router's handshake names it as a
`router` or a `client` peer.
"""

from __future__ import annotations

import enum


class Role(str, enum.Enum):
    PREFILL = "prefill"  # computes prompts, streams their KV to decode instances
    DECODE = "decode"  # reserves blocks, receives the KV, decodes
    BOTH = "both"  # colocated: prefill and decode on one engine, with chunked prefill
    ROUTER = "router"  # picks instances and relays tokens; holds no model
    CLUSTER = "cluster"  # command line only: launches a router and instances as processes
    CLIENT = "client"  # handshake only: a client of the router's control port

    @property
    def is_instance(self) -> bool:
        """A role that runs an engine and serves the control plane for a router."""
        return self in INSTANCE_ROLES

    @property
    def serves_prefill(self) -> bool:
        """Answers `Prefill`: computes a prompt and streams its KV to another instance."""
        return self in (Role.PREFILL, Role.BOTH)

    @property
    def serves_decode(self) -> bool:
        """Answers `Reserve` and `Decode`: holds blocks, adopts the KV that lands, decodes."""
        return self in (Role.DECODE, Role.BOTH)


INSTANCE_ROLES = (Role.PREFILL, Role.DECODE, Role.BOTH)
