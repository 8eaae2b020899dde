"""The router's connections to its instances: handshake and registration, liveness (an
instance silent past the liveness timeout is declared dead, `evict`; one whose connection
closes is lost), and the periodic stats poll.

It owns the channel -> instance table; the router hands it the function that dispatches the
instances' messages, and asks it which instance a channel belongs to.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from minipd.control.channel import Channel
from minipd.control.handshake import SharedSecret, open_channel
from minipd.control.messages import Evict, GetStats, Message
from minipd.control.role import Role
from minipd.router.registry import IncompatibleInstance, InstanceHandle, InstanceRegistry
from minipd.router.router_config import RouterConfig
from minipd.router.router_counters import RouterCounters

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
STALE_AFTER_POLLS = 3  # stats missing for this many polls (plus one poll's timeout) are stale


class InstanceLinks:
    def __init__(
        self,
        registry: InstanceRegistry,
        config: RouterConfig,
        counters: RouterCounters,
        secret: SharedSecret | None,
        on_message: Callable[[Channel, Message], None],
    ):
        self.registry, self.config, self.counters = registry, config, counters
        self.secret = secret  # proven to every instance, and required of them
        self._on_message = on_message
        self._by_channel: dict[Channel, InstanceHandle] = {}
        self._stats_task: asyncio.Task | None = None
        self._closing = False

    def handle_of(self, channel: Channel) -> InstanceHandle | None:
        return self._by_channel.get(channel)

    async def connect(
        self, host: str, port: int, timeout: float = 30.0, expected_role: Role | None = None
    ) -> InstanceHandle:
        """Connect to an instance's control port, handshake, and register it.

        Raises IncompatibleInstance (fingerprint mismatch, saying what differs, or another role
        than `expected_role`), AuthenticationError (the instance and the router do not share
        the cluster secret), or ConnectionError/TimeoutError when it cannot be reached.
        """
        channel, welcome = await open_channel(
            host,
            port,
            self._on_message,
            f"router->{host}:{port}",
            Role.ROUTER,
            self.secret,
            timeout,
            self.config.liveness_timeout_s,
        )
        try:
            if expected_role is not None and welcome.role is not expected_role:
                raise IncompatibleInstance(
                    f"{host}:{port} is a {welcome.role.value} instance, not {expected_role.value}"
                )
            handle = InstanceHandle(welcome, channel, (host, port))
            handle.stale_after_s = STALE_AFTER_POLLS * STATS_INTERVAL_S + self.config.stats_timeout_s
            self.registry.add(handle)
        except BaseException:
            await channel.close()
            raise
        self._by_channel[channel] = handle
        handle.set_stats(await channel.call(GetStats(), timeout))
        if welcome.liveness_timeout_s > 0 and self.config.liveness_timeout_s > 0:
            channel.watch_liveness(
                self.config.liveness_timeout_s,
                welcome.liveness_timeout_s,
                on_silent=lambda reason: self.evict(handle, reason),
            )
        asyncio.get_running_loop().create_task(self._watch(handle))
        if self._stats_task is None:
            self._stats_task = asyncio.get_running_loop().create_task(self._poll_stats())
        log.info("registered %s (%s) at %s:%d", handle.instance_id, handle.role.value, host, port)
        return handle

    async def close(self) -> None:
        """Stop polling and close every connection; what closes then is no longer a loss."""
        self._closing = True
        if self._stats_task is not None:
            self._stats_task.cancel()
        for handle in list(self._by_channel.values()):
            await handle.channel.close()

    def evict(self, handle: InstanceHandle, reason: str) -> None:
        """`handle` went silent: declare it dead now (its requests end, it is never picked
        again, its peers drop what they do with it), but keep the connection open to learn when
        it can no longer write (it closes once it ended everything, or its process is gone)."""
        if handle.evicted or not handle.is_alive or self._closing:
            return
        handle.evicted = True
        self.counters.num_evictions += 1
        log.warning("instance %s declared dead: %s", handle.instance_id, reason)
        handle.channel.send(Evict(reason=reason))
        self.registry.lose(handle, f"{handle.instance_id} declared dead: {reason}", fenced=False)
        handle.channel.fail_calls(f"{handle.instance_id} declared dead: {reason}")

    async def _watch(self, handle: InstanceHandle) -> None:
        await handle.channel.closed.wait()
        self._by_channel.pop(handle.channel, None)
        if self._closing:
            return
        reason = f"{handle.instance_id}: connection closed ({handle.channel.close_reason})"
        if not handle.evicted:
            log.warning("instance %s lost: %s", handle.instance_id, handle.channel.close_reason)
            self.registry.lose(handle, reason, fenced=True)
            return
        if self.registry.instances.get(handle.instance_id) is not None:
            # Registered again meanwhile (resumed, or restarted under the same id): its peers must
            # not drop what they do with the registered one; blocks they hold for the old one's
            # writes go back when those writes' ends arrive.
            log.info("the old connection of %s closed; it is registered again", handle.instance_id)
            return
        # it can write no more: its peers fence its writes
        self.registry.tell_peer_lost(handle.instance_id, reason, fenced=True)

    async def _poll_stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)  # periodic load report, not a synchronisation
            await self.registry.refresh_stats(self.config.stats_timeout_s)
