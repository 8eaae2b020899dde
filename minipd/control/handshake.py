"""The control-plane handshake: who is on the other end, and whether it knows the cluster secret.

Every connection starts with it, in both directions of trust:

1. client -> server `Hello(protocol_version, role, nonce_c)`;
2. a server with a secret answers `Challenge(nonce_s)`; one without answers `Welcome` at once
   (no authentication: the behaviour before secrets existed);
3. client -> server `Prove(HMAC(secret, client label, version, role, nonce_c, nonce_s))`;
4. server -> client `Welcome(..., proof=HMAC(secret, server label, ...same..., instance_id,
   start_nonce))`, or `CallError(kind="auth")` and a hang-up.

The client checks the server's proof, so a process squatting on an instance's port cannot
pass for it, and nothing between the two can alter who the Welcome says answered: its
instance id and start nonce (random at the instance's start), which a router compares with
what the registry's record names (router/instance_identity.py). A client with a secret
refuses a server without one, and the reverse, each saying which side lacks it. After the
handshake both ends know the peer's role (`channel.peer_role`) and raise the frame caps to
what the peers' max_model_len needs (`limits.py`). The server side lives in `ControlServer` (`server.py`).
"""

from __future__ import annotations

import hmac

from minipd.control.channel import Channel, RemoteError
from minipd.control.limits import max_frame_bytes
from minipd.control.messages import PROTOCOL_VERSION, Challenge, Hello, Message, Prove, Welcome
from minipd.control.role import Role
from minipd.transports.shared_secret import NONCE_BYTES, SharedSecret, new_nonce

__all__ = [
    "AuthenticationError",
    "SharedSecret",
    "client_proof",
    "client_proof_ok",
    "handshake",
    "open_channel",
    "server_proof",
]  # SharedSecret: for layers that may not import transports (the router)

CLIENT_LABEL = b"minipd control client v3"
SERVER_LABEL = b"minipd control server v3"
SECRET_HINT = "start every process of the cluster with the same --cluster-secret (or MINIPD_CLUSTER_SECRET)"


class AuthenticationError(RuntimeError):
    """The handshake failed: a secret is missing on one side, the secrets differ, or the
    server refused this role; the message says which."""


def client_proof(secret: SharedSecret, role: Role, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return secret.proof(CLIENT_LABEL, PROTOCOL_VERSION, role.value, client_nonce, server_nonce)


def client_proof_ok(secret: SharedSecret, proof: bytes, role: Role, client_nonce: bytes, server_nonce: bytes) -> bool:
    return secret.verify(proof, CLIENT_LABEL, PROTOCOL_VERSION, role.value, client_nonce, server_nonce)


def server_proof(
    secret: SharedSecret, role: Role, client_nonce: bytes, server_nonce: bytes, instance_id: str, start_nonce: bytes
) -> bytes:
    """The server's proof, over the identity its Welcome claims (`instance_id`, `start_nonce`) too."""
    parts = (PROTOCOL_VERSION, role.value, client_nonce, server_nonce, instance_id, start_nonce)
    return secret.proof(SERVER_LABEL, *parts)


async def handshake(
    channel: Channel,
    role: Role,
    secret: SharedSecret | None,
    timeout: float,
    peer: str,
    liveness_timeout_s: float = 0.0,
) -> Welcome:
    """Introduce ourselves as `role` on a freshly connected `channel` to `peer` (for messages)
    and authenticate both ways; returns the server's Welcome. `liveness_timeout_s` > 0 asks
    for heartbeats (`Hello.liveness_timeout_s`). Raises AuthenticationError, or
    ChannelClosed/TimeoutError when the connection fails."""
    nonce = new_nonce()
    try:
        reply: Message = await channel.call(
            Hello(protocol_version=PROTOCOL_VERSION, role=role, nonce=nonce, liveness_timeout_s=liveness_timeout_s),
            timeout,
        )
        if isinstance(reply, Challenge):
            if secret is None:
                raise AuthenticationError(
                    f"{peer} requires the cluster secret and this process has none; {SECRET_HINT}"
                )
            if len(reply.nonce) != NONCE_BYTES:
                raise AuthenticationError(f"{peer} sent a challenge of {len(reply.nonce)} bytes, not {NONCE_BYTES}")
            server_nonce = reply.nonce
            reply = await channel.call(Prove(proof=client_proof(secret, role, nonce, server_nonce)), timeout)
            if isinstance(reply, Welcome) and not reply.proof:
                raise AuthenticationError(f"{peer} sent no proof of the cluster secret")
            if isinstance(reply, Welcome) and not hmac.compare_digest(
                reply.proof, server_proof(secret, role, nonce, server_nonce, reply.instance_id, reply.start_nonce)
            ):
                raise AuthenticationError(
                    f"{peer} does not know the cluster secret (a process impersonating it?); refusing to talk to it"
                )
        elif isinstance(reply, Welcome) and secret is not None:
            raise AuthenticationError(
                f"{peer} has no cluster secret configured and this process has one; {SECRET_HINT}"
            )
    except RemoteError as exc:
        raise AuthenticationError(f"{peer} refused the connection: {exc}") from None
    if not isinstance(reply, Welcome):
        raise AuthenticationError(f"{peer} answered the handshake with {type(reply).__name__}")
    channel.peer_role = reply.role
    channel.max_frame_bytes = channel.max_send_bytes = max_frame_bytes(reply.max_model_len)
    return reply


async def open_channel(
    host: str,
    port: int,
    handler,
    name: str,
    role: Role,
    secret: SharedSecret | None,
    timeout: float,
    liveness_timeout_s: float = 0.0,
) -> tuple[Channel, Welcome]:
    """Connect to a control port and handshake as `role` (see `handshake`); the channel is
    closed on failure."""
    channel = await Channel.connect(host, port, handler, name, timeout)
    try:
        return channel, await handshake(channel, role, secret, timeout, f"{host}:{port}", liveness_timeout_s)
    except BaseException:
        await channel.close()
        raise
