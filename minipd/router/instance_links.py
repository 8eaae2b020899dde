"""The router's connections to its instances: handshake and registration, liveness (an
instance silent past the liveness timeout is declared dead, `evict`; one whose connection
closes is lost), readmission, and the periodic stats poll.

Membership heals: every address the router registered an instance at (from `--prefill`,
`--decode`, `--colocated`, or an instance's `Register`) stays a member. Once a lost member's
connection has closed (the instance ended everything it did for that connection, or its
process is gone), the router redials the address, backing off from `REDIAL_FIRST_S` to
`REDIAL_MAX_S`, until an instance answers there or the same instance id registers elsewhere
(a restart on a new port). An instance that answers again is readmitted as a new member: a
new handle (new connection, no prefix or load figures carried over), and only once its
stats, settled (its aborts applied, its fenced blocks back), show no reservation and no
fenced block left from before; its peers were told it was lost (fenced) when its old
connection closed, so no late KV write of the old member lands anywhere. Registering an
address whose instance is alive and registered answers with that instance (idempotent), so
a redial and an instance's own `Register` may race.

It owns the channel -> instance table; the router hands it the function that dispatches the
instances' messages, and asks it which instance a channel belongs to.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from minipd.control.channel import Channel, ChannelClosed, RemoteError
from minipd.control.handshake import AuthenticationError, SharedSecret, open_channel
from minipd.control.messages import Evict, GetStats, Message, SubscribeKVEvents
from minipd.control.role import Role
from minipd.router.instance_identity import InstanceIdentity, WrongInstance, check_identity
from minipd.router.registry import IncompatibleInstance, InstanceHandle, InstanceRegistry
from minipd.router.router_config import RouterConfig
from minipd.router.router_counters import RouterCounters

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
STALE_AFTER_POLLS = 3  # stats missing for this many polls (plus one poll's timeout) are stale
REDIAL_FIRST_S = 0.2  # the first redial of a lost member is at once, the next after this
REDIAL_MAX_S = 2.0  # the backoff between redials grows to this, and stays there
REDIAL_TIMEOUT_S = 15.0  # one redial: handshake, and settled stats (the instance settles within 10 s)
REDIAL_ERRORS = (ConnectionError, OSError, TimeoutError, AuthenticationError, RemoteError, ChannelClosed)


class NotSettled(RuntimeError):
    """An instance that answers again still holds what its old connection left (readmitted later)."""


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
        # each connection's instance: read by the router's message dispatch as it is (no call)
        self.by_channel: dict[Channel, InstanceHandle] = {}
        self._stats_task: asyncio.Task | None = None
        self._closing = False
        self._members: set[tuple[str, int]] = set()  # addresses redialed when their instance is lost
        self._seen: set[tuple[str, int]] = set()  # every address ever registered: a new instance there is readmitted
        self._redialing: dict[tuple[str, int], asyncio.Task] = {}
        self._address_locks: dict[tuple[str, int], asyncio.Lock] = {}

    def at_address(self, address: tuple[str, int]) -> InstanceHandle | None:
        """The alive, registered instance at `address`, if any."""
        return next((h for h in self.registry.alive() if h.address == address), None)

    async def connect(
        self,
        host: str,
        port: int,
        timeout: float = 30.0,
        expected_role: Role | None = None,
        identity: InstanceIdentity | None = None,
    ) -> InstanceHandle:
        """Connect to an instance's control port, handshake, and register it; the address stays
        a member (redialed whenever its instance is lost). An address whose instance is
        registered and alive answers with it.

        With `identity` (what a registry record names), the process there must prove to be
        that instance, else WrongInstance and nothing changes: the instance registered under
        that id elsewhere is kept, and the address is not a member. A verified one supersedes
        an older process of the same id registered at another address (declared dead, its
        address forgotten); the same process (the same start nonce) is not connected twice.

        Raises IncompatibleInstance (fingerprint mismatch, saying what differs, or another role
        than `expected_role`), AuthenticationError (the instance and the router do not share
        the cluster secret), NotSettled (an instance readmitted at a member address still
        holds what its old connection left), or ConnectionError/TimeoutError when it cannot be
        reached (or its old connection does not close within `timeout`).
        """
        address = (host, port)
        async with self._address_locks.setdefault(address, asyncio.Lock()):
            handle = self.at_address(address)
            if handle is None:
                handle = await self._connect(host, port, timeout, expected_role, address in self._seen, identity)
            elif identity is not None:
                check_identity(identity, handle.welcome, address)
            if expected_role is not None and handle.role is not expected_role:
                raise IncompatibleInstance(
                    f"{host}:{port} is a {handle.role.value} instance, not {expected_role.value}"
                )
        self._members.add(address)
        self._seen.add(address)
        return handle

    def forget(self, address: tuple[str, int]) -> None:
        """`address` is no longer a member: not redialed when its instance is lost (the
        registry dropped it); a later `connect` there readmits it as usual."""
        self._members.discard(address)
        task = self._redialing.pop(address, None)
        if task is not None:
            task.cancel()

    def keep(self, address: tuple[str, int]) -> None:
        """`address` is a member again (undoes `forget` while its instance is still registered)."""
        self._members.add(address)

    def _superseded(self, identity: InstanceIdentity, address: tuple[str, int]) -> InstanceHandle | None:
        """The live handle of `identity`'s id at another address, which a verified connection
        to `address` replaces; WrongInstance if that is the same process."""
        old = self.registry.instances.get(identity.instance_id)
        if old is None or not old.is_alive or old.address == address:
            return None
        if old.welcome.start_nonce == identity.start_nonce:
            raise WrongInstance(f"{address[0]}:{address[1]} is {identity}, already connected at {old.address}")
        return old

    async def _connect(
        self,
        host: str,
        port: int,
        timeout: float,
        expected_role: Role | None,
        readmit: bool,
        identity: InstanceIdentity | None,
    ):
        if readmit:
            # The old member must have ended what it did for us first (it aborts it all, then
            # closes): nothing it held before is trusted.
            for old in list(self.by_channel.values()):
                if old.address == (host, port):
                    await asyncio.wait_for(old.channel.closed.wait(), timeout)
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
            superseded = None
            if identity is not None:
                check_identity(identity, welcome, (host, port))
                superseded = self._superseded(identity, (host, port))
            if expected_role is not None and welcome.role is not expected_role:
                raise IncompatibleInstance(
                    f"{host}:{port} is a {welcome.role.value} instance, not {expected_role.value}"
                )
            handle = InstanceHandle(welcome, channel, (host, port))
            handle.stale_after_s = STALE_AFTER_POLLS * STATS_INTERVAL_S + self.config.stats_timeout_s
            settled = await channel.call(GetStats(settle=readmit), timeout)
            if readmit and (settled.num_reservations or settled.num_fencing_blocks):
                raise NotSettled(
                    f"{welcome.instance_id} at {host}:{port} still holds {settled.num_reservations} reservations "
                    f"and {settled.num_fencing_blocks} fenced blocks"
                )
            if superseded is not None:
                self.forget(superseded.address)
                self.evict(superseded, f"it restarted at {host}:{port} (start {identity.start_nonce.hex()[:12]})")
            self.registry.add(handle)
        except BaseException:
            await channel.close()
            raise
        self.by_channel[channel] = handle
        handle.set_stats(settled)
        channel.send(SubscribeKVEvents())  # its events from now on: the handle is there to take them
        if welcome.liveness_timeout_s > 0 and self.config.liveness_timeout_s > 0:
            channel.watch_liveness(
                self.config.liveness_timeout_s,
                welcome.liveness_timeout_s,
                on_silent=lambda reason: self.evict(handle, reason),
            )
        asyncio.get_running_loop().create_task(self._watch(handle))
        if self._stats_task is None:
            self._stats_task = asyncio.get_running_loop().create_task(
                self.registry.poll_stats(STATS_INTERVAL_S, self.config.stats_timeout_s)
            )
        if readmit:
            self.counters.num_readmissions += 1
        log.info(
            "%s %s (%s) at %s:%d",
            "readmitted" if readmit else "registered",
            handle.instance_id,
            handle.role.value,
            host,
            port,
        )
        return handle

    async def close(self) -> None:
        """Stop polling and close every connection; what closes then is no longer a loss."""
        self._closing = True
        if self._stats_task is not None:
            self._stats_task.cancel()
        for task in list(self._redialing.values()):
            task.cancel()
        for handle in list(self.by_channel.values()):
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
        self.by_channel.pop(handle.channel, None)
        if self._closing:
            return
        reason = f"{handle.instance_id}: connection closed ({handle.channel.close_reason})"
        registered = self.registry.instances.get(handle.instance_id)
        if registered is not None and registered is not handle:
            # Registered again meanwhile (resumed, or restarted under the same id): its peers must
            # not drop what they do with the registered one; blocks they hold for the old one's
            # writes go back when those writes' ends arrive.
            handle.mark_lost(reason)
            log.info("the old connection of %s closed; it is registered again", handle.instance_id)
            return
        if not handle.evicted:
            # one no longer a member (forgotten: a pool scaler removing it) left as asked
            left = handle.address not in self._members
            log.log(logging.INFO if left else logging.WARNING, "instance %s %s: %s", handle.instance_id,
                    "left" if left else "lost", handle.channel.close_reason)  # fmt: skip
            self.registry.lose(handle, reason, fenced=True)
        else:
            # it can write no more: its peers fence its writes
            self.registry.tell_peer_lost(handle.instance_id, reason, fenced=True)
        self._redial_later(handle)

    def _redial_later(self, lost: InstanceHandle) -> None:
        if lost.address in self._members and lost.address not in self._redialing:
            task = asyncio.get_running_loop().create_task(self._redial(lost.instance_id, lost.address))
            self._redialing[lost.address] = task

    def _back(self, instance_id: str, address: tuple[str, int]) -> bool:
        return any(h.instance_id == instance_id or h.address == address for h in self.registry.alive())

    async def _redial(self, instance_id: str, address: tuple[str, int]) -> None:
        """Redial a lost member's address, backing off, until an instance is registered there
        or `instance_id` is registered elsewhere."""
        delay, tries = REDIAL_FIRST_S, 0
        try:
            while not self._closing and not self._back(instance_id, address):
                try:
                    await self.connect(*address, REDIAL_TIMEOUT_S)
                    return
                except IncompatibleInstance as exc:  # another model, or its id registered elsewhere
                    log.warning("no longer redialing %s:%d: %s", *address, exc)
                    self._members.discard(address)
                    return
                except (NotSettled, *REDIAL_ERRORS) as exc:
                    tries += 1
                    level = logging.INFO if tries == 1 else logging.DEBUG
                    log.log(level, "redialing %s at %s:%d (try %d): %s", instance_id, *address, tries, exc)
                await asyncio.sleep(delay)  # backoff between redials of an address that does not answer
                delay = min(2 * delay, REDIAL_MAX_S)
        finally:
            self._redialing.pop(address, None)
