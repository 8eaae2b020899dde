"""The router's view of its instances: connections, compatibility, load, and picking.

Prefill is picked by prefix-cache overlap minus queue load. The overlap: an instance's longest
run of the prompt's leading blocks that its KV events say it holds (the prefix index,
prefix_index.py) or that the router sent there since (`remember_prefix`: a prompt still being
prefilled has published nothing yet) and no event said it dropped; or the shared KV tier's
run, where the instance has the tier. Decode is picked by free KV blocks and running
requests. Load figures combine the instance's last reported `Stats` with what the router
has in flight there since. Only live instances are picked: not lost, not evicted (declared
dead), not draining (for a role switch or a shutdown); and one whose stats are stale (it did
not answer the last polls in time) only when no instance with fresh stats can take the
request. Once switched, an instance's handle takes the new role and epoch and forgets its
prefixes (the switch reset its prefix cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Container, Iterable, Iterator, NamedTuple

import msgspec

from minipd.control.channel import Channel, ChannelClosed, RemoteError
from minipd.control.messages import (
    KV_MEDIUM_LOCAL,
    AllBlocksCleared,
    BlockRemoved,
    Fingerprint,
    GetStats,
    PeerLost,
    Stats,
    Welcome,
)
from minipd.control.role import Role
from minipd.engine.block_manager import chain_hashes
from minipd.router.prefix_index import PrefixIndex

log = logging.getLogger(__name__)

MAX_LOST_DECODES_KEPT = 8  # the newest lost decode instances named to a request that finds none


class IncompatibleInstance(RuntimeError):
    """An instance whose fingerprint differs from the cluster's; the message says what differs."""


class InstanceHandle:
    def __init__(self, welcome: Welcome, channel: Channel, address: tuple[str, int]):
        self.instance_id = welcome.instance_id
        self.role = welcome.role
        self.epoch = welcome.epoch  # role epoch: sent with every new piece of work
        # it takes no new work: a role switch is under way, or it is shutting down
        self.draining = False
        self.welcome = welcome
        self.channel = channel
        self.address = address
        self.stats: Stats | None = None
        self.stats_at = time.monotonic()  # when `stats` last arrived
        self.stale_after_s = float("inf")  # stats older than this are not trusted (set by the router)
        self.lost = asyncio.Event()  # set once it died or was declared dead: its requests end
        self.lost_reason = ""
        self.evicted = False  # declared dead while its connection stays open (to learn when it is gone)
        self.num_inflight = 0  # requests the router has routed here and not yet finished
        self.num_routed = 0  # requests ever routed here (only grows): a short one between two looks counts
        self.num_inflight_tokens = 0  # prompt tokens queued for prefill here
        self._prefix_hashes: OrderedDict[int, None] = OrderedDict()
        self._prefix_capacity = 0

    @property
    def is_alive(self) -> bool:
        return not self.channel.closed.is_set() and not self.lost.is_set()

    @property
    def is_stale(self) -> bool:
        return time.monotonic() - self.stats_at > self.stale_after_s

    def set_stats(self, stats: Stats) -> None:
        """Fresh stats; a newer epoch there means someone else switched the instance."""
        self.stats, self.stats_at = stats, time.monotonic()
        if stats.epoch > self.epoch and not stats.switching:
            self.take_role(stats.role, stats.epoch)

    def mark_lost(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()

    @contextlib.contextmanager
    def counted(self, num_prompt_tokens: int = 0) -> Iterator[None]:
        """Count one request (and its prompt tokens to prefill) as in flight here while inside."""
        self.num_inflight += 1
        self.num_routed += 1
        self.num_inflight_tokens += num_prompt_tokens
        try:
            yield
        finally:
            self.num_inflight -= 1
            self.num_inflight_tokens -= num_prompt_tokens

    def remember_prefix(self, hashes: Iterable[int], capacity: int) -> None:
        self._prefix_capacity = capacity
        for h in hashes:
            self._prefix_hashes[h] = None
            self._prefix_hashes.move_to_end(h)
        while len(self._prefix_hashes) > self._prefix_capacity:
            self._prefix_hashes.popitem(last=False)

    def take_role(self, role: Role, epoch: int) -> None:
        """The instance now serves as `role` at `epoch`, with an empty prefix cache."""
        self.role, self.epoch = role, epoch
        self.welcome = msgspec.structs.replace(self.welcome, role=role, epoch=epoch)
        self._prefix_hashes.clear()

    def prefix_overlap(self, hashes: list[int], held: Container[int] = ()) -> int:
        """Leading full blocks of the prompt this instance probably still caches: sent there
        (`remember_prefix`) or `held` (what its KV events say)."""
        n = 0
        for h in hashes:
            if h not in self._prefix_hashes and h not in held:
                break
            n += 1
        return n

    def forget_prefixes(self, events: Iterable) -> None:
        """What the instance's KV events say its own cache dropped is no longer guessed held."""
        for event in events:
            if isinstance(event, BlockRemoved) and event.medium == KV_MEDIUM_LOCAL:
                for h in event.block_hashes:
                    self._prefix_hashes.pop(h, None)
            elif isinstance(event, AllBlocksCleared) and event.medium == KV_MEDIUM_LOCAL:
                self._prefix_hashes.clear()

    def free_blocks(self) -> int:
        return self.stats.num_free_blocks if self.stats else 0

    def running(self) -> int:
        return (self.stats.num_running + self.stats.num_waiting if self.stats else 0) + self.num_inflight


class PrefillChoice(NamedTuple):
    instance: InstanceHandle | None
    num_cached_tokens: int  # expected prefix-cache hit there


class InstanceRegistry:
    def __init__(self) -> None:
        self.instances: dict[str, InstanceHandle] = {}
        self.fingerprint: Fingerprint | None = None
        self.block_size = 0
        # decode-capable instances lost and not registered again since: id -> how it was lost,
        # so a request finding no decode instance is told which died rather than nothing
        self.lost_decodes: OrderedDict[str, str] = OrderedDict()
        self.prefix_index = PrefixIndex()

    def add(self, handle: InstanceHandle) -> None:
        """Register an instance; raises IncompatibleInstance when it cannot share KV with the others."""
        fingerprint = handle.welcome.fingerprint
        if fingerprint is None:
            raise IncompatibleInstance(f"{handle.instance_id} sent no fingerprint")
        if self.fingerprint is not None and fingerprint != self.fingerprint:
            diff = "; ".join(fingerprint.differences(self.fingerprint))
            raise IncompatibleInstance(f"{handle.instance_id} is incompatible with the cluster: {diff}")
        if handle.instance_id in self.instances and self.instances[handle.instance_id].is_alive:
            raise IncompatibleInstance(f"instance id {handle.instance_id!r} is already registered")
        self.fingerprint = fingerprint
        self.block_size = fingerprint.block_size
        self.instances[handle.instance_id] = handle
        self.lost_decodes.pop(handle.instance_id, None)

    def kv_events(self, handle: InstanceHandle | None, events: list) -> None:
        """`handle`'s KV events into the prefix index, if it is the registered instance of its id."""
        if handle is not None and self.instances.get(handle.instance_id) is handle:
            self.prefix_index.apply(handle.instance_id, events)
            handle.forget_prefixes(events)

    def remove(self, instance_id: str) -> InstanceHandle | None:
        self.prefix_index.forget(instance_id)
        return self.instances.pop(instance_id, None)

    def lose(self, handle: InstanceHandle, reason: str, fenced: bool) -> None:
        """`handle` died or was declared dead: unregister it (unless registered again meanwhile),
        end its requests, and tell every other instance, which drops what it does with it."""
        if self.instances.get(handle.instance_id) is handle:
            self.remove(handle.instance_id)
            if handle.role.serves_decode:
                self.lost_decodes[handle.instance_id] = reason
                while len(self.lost_decodes) > MAX_LOST_DECODES_KEPT:
                    self.lost_decodes.popitem(last=False)
        handle.mark_lost(reason)
        self.tell_peer_lost(handle.instance_id, reason, fenced)

    def tell_peer_lost(self, instance_id: str, reason: str, fenced: bool) -> None:
        for other in self.instances.values():
            other.channel.send(PeerLost(instance_id=instance_id, reason=reason, fenced=fenced))

    def live_stats(self) -> list[Stats]:
        return [h.stats for h in self.instances.values() if h.stats is not None and h.is_alive]

    async def refresh_stats(self, timeout: float, settle: bool = False) -> list[Stats]:
        """Ask every instance for fresh stats, all at once, each within `timeout` (with `settle`,
        after its pending aborts have landed); one that does not answer in time keeps its old
        stats, which turn stale."""
        await asyncio.gather(*(_poll(h, settle, timeout) for h in list(self.instances.values())))
        return self.live_stats()

    async def poll_stats(self, interval_s: float, timeout: float) -> None:
        """Refresh every instance's stats each `interval_s` (`refresh_stats`), until cancelled."""
        while True:
            await asyncio.sleep(interval_s)  # periodic load report, not a synchronisation
            await self.refresh_stats(timeout)

    def alive(self, exclude: set[str] = frozenset()) -> list[InstanceHandle]:
        return [h for h in self.instances.values() if h.is_alive and h.instance_id not in exclude]

    def serving(self, exclude: set[str] = frozenset()) -> list[InstanceHandle]:
        """Alive and taking new work (not draining for a role switch or a shutdown)."""
        return [h for h in self.alive(exclude) if not h.draining]

    @staticmethod
    def _pickable(candidates: list[InstanceHandle]) -> list[InstanceHandle]:
        """Those with fresh stats if any, else the stale ones."""
        fresh = [h for h in candidates if not h.is_stale]
        return fresh or candidates

    def prefill_candidates(self, exclude: set[str] = frozenset()) -> list[InstanceHandle]:
        """Prefill instances (a colocated instance is a decode target that prefills for itself)."""
        return self._pickable([h for h in self.serving(exclude) if h.role is Role.PREFILL])

    def decode_candidates(self, exclude: set[str] = frozenset()) -> list[InstanceHandle]:
        return self._pickable([h for h in self.serving(exclude) if h.role.serves_decode])

    def decode_num_blocks(self) -> int:
        """KV blocks of the decode-capable instances taking new work, as last reported."""
        return sum(h.stats.num_blocks for h in self.serving() if h.role.serves_decode and h.stats is not None)

    def prompt_hashes(self, token_ids: list[int]) -> list[int]:
        return chain_hashes(token_ids, self.block_size)

    def overlap(self, handle: InstanceHandle, hashes: list[int]) -> int:
        """Leading blocks of `hashes` that `handle` would not compute: those its KV events say
        it holds or the router sent there since (and no event said it dropped), or the tier's
        when it has the tier."""
        has_tier = handle.stats is not None and handle.stats.kv_tier is not None
        tier = self.prefix_index.tier_match(hashes) if has_tier else 0
        return max(handle.prefix_overlap(hashes, self.prefix_index.held(handle.instance_id)), tier)

    def pick_prefill(self, hashes: list[int], exclude: set[str] = frozenset()) -> PrefillChoice:
        """The prefill instance with the most of the prompt's leading blocks (`overlap`) less
        its queued prompt tokens; fewer requests in flight breaks ties."""
        candidates = self.prefill_candidates(exclude)
        if not candidates:
            return PrefillChoice(None, 0)
        overlaps = {h.instance_id: self.overlap(h, hashes) for h in candidates}

        def score(h: InstanceHandle) -> tuple[int, int]:
            return (overlaps[h.instance_id] * self.block_size - h.num_inflight_tokens, -h.num_inflight)

        best = max(candidates, key=score)
        return PrefillChoice(best, overlaps[best.instance_id] * self.block_size)

    def pick_decode(self, exclude: set[str] = frozenset()) -> InstanceHandle | None:
        candidates = self.decode_candidates(exclude)
        if not candidates:
            return None
        return min(candidates, key=lambda h: (h.running(), -h.free_blocks()))


async def _poll(handle: InstanceHandle, settle: bool, timeout: float) -> None:
    try:
        handle.set_stats(await handle.channel.call(GetStats(settle=settle), timeout))
    except (ChannelClosed, TimeoutError, RemoteError):
        pass  # it keeps its old stats, which turn stale
