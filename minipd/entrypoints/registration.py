"""An instance started with `--router HOST:PORT` registers with that router, and keeps itself
registered: whenever no router is connected to it (the router froze past the liveness
bound and the instance dropped it, the instance itself froze and was declared dead, the
router restarted, or a partition ended the connection), it sends `Register` again, backing
off from `RETRY_FIRST_S` to `RETRY_MAX_S` between tries, until a router is connected again.

The router also redials the addresses it registered (router/instance_links.py), so after a
freeze the two may race; a `Register` for an instance the router already serves answers
with it. The first registration is `register`, whose errors end the instance's start (a
wrong secret or an incompatible model is a mistake to report, not to retry); later ones are
logged and retried.
"""

from __future__ import annotations

import asyncio
import logging

from minipd.control.channel import ChannelClosed, RemoteError
from minipd.control.handshake import AuthenticationError, open_channel
from minipd.control.messages import Register
from minipd.control.role import Role
from minipd.disagg.instance import Instance
from minipd.transports.shared_secret import SharedSecret

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.2
RETRY_MAX_S = 2.0
RETRY_TIMEOUT_S = 20.0  # one later try: the router may wait up to its settle timeout to readmit us


async def register(
    router: tuple[str, int], role: Role, host: str, port: int, secret: SharedSecret | None, timeout: float
) -> None:
    """Ask the router at `router` to connect to this instance at host:port (RemoteError says
    why it refused)."""
    channel, _ = await open_channel(*router, None, "register", role, secret, timeout)
    try:
        await channel.call(Register(host=host, port=port), timeout)
    finally:
        await channel.close()


async def keep_registered(
    instance: Instance, router: tuple[str, int], role: Role, host: str, port: int, secret: SharedSecret | None
) -> None:
    """Register again whenever no router is connected; runs until cancelled."""
    delay = RETRY_FIRST_S
    while True:
        await instance.unrouted.wait()
        try:
            await register(router, role, host, port, secret, RETRY_TIMEOUT_S)
        except (ConnectionError, OSError, TimeoutError, AuthenticationError, RemoteError, ChannelClosed) as exc:
            log.warning("%s: registering with the router at %s:%d again failed: %s", instance.instance_id, *router, exc)
        if not instance.unrouted.is_set():
            delay = RETRY_FIRST_S
            continue
        await asyncio.sleep(delay)  # backoff between registrations while no router connects back
        delay = min(2 * delay, RETRY_MAX_S)
