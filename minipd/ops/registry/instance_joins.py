"""A router's instances from their registry records (`P/instances/ID`): connect to the process
a record names, once that process proved it is the one; drop an instance whose record is gone.

A record is a pointer to dial and an identity to expect, nothing more:
- A record (or one naming another address or start nonce than the instance served now) is
  joined: the router connects to its address with the identity it names (instance id and
  start nonce), which the handshake must show (router/instance_identity.py). Until then
  nothing changes: the instance served now keeps serving. Once shown, an older process of
  that id elsewhere is dropped (it restarted there) and the new one serves from its first
  stats on. The join is retried while that record stays, backing off from
  `JOIN_RETRY_FIRST_S` to `JOIN_RETRY_MAX_S` while nobody answers there, and from
  `WRONG_RETRY_FIRST_S` to `WRONG_RETRY_MAX_S` while another process answers (logged once
  per record): so a record overwritten with another address never evicts the real instance,
  which writes its record back at once (own_key.py), ending the join.
- A record whose role epoch moved on makes the router ask the instance for its stats, and
  the handle takes the role and epoch the instance itself reports (a record's epoch alone
  could be forged past every real one).
- A record written without a lease is no instance's (each writes under its lease): it is
  ignored, the router keeping what it knew of that key; deleted (as seen) when the router
  knows no record of that id (else its instance writes it back, and a delete would look
  like that instance's end to every router).
- A deleted key drops the instance (its lease expired, or it shut down): declared dead, its
  requests retried, its address not redialed. Deleted by anyone else, the instance writes it
  back at once and is joined again (readmitted once settled).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from minipd.control.channel import ChannelClosed, RemoteError
from minipd.control.messages import GetStats
from minipd.ops.registry.key_cleanup import KeyCleanup
from minipd.ops.registry.records import InstanceRecord
from minipd.ops.registry.watcher import Entry
from minipd.router.instance_identity import InstanceIdentity, WrongInstance
from minipd.router.instance_links import REDIAL_ERRORS, NotSettled
from minipd.router.registry import IncompatibleInstance, InstanceHandle
from minipd.router.router import Router

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 15.0  # one connection try: handshake and settled stats
JOIN_RETRY_FIRST_S = 0.1
JOIN_RETRY_MAX_S = 2.0
WRONG_RETRY_FIRST_S = 0.5  # another process answers at the record's address: the record is likely to change
WRONG_RETRY_MAX_S = 8.0


class InstanceJoins:
    def __init__(self, router: Router, cleanup: KeyCleanup, claimed: Callable[[str], bool]):
        self.router, self.cleanup, self._claimed = router, cleanup, claimed
        self.records: dict[str, InstanceRecord] = {}
        self._joining: dict[str, asyncio.Task] = {}
        self._polls: set[asyncio.Task] = set()
        self.num_wrong_instance = 0  # joins that found another process than the record named

    def put(self, instance_id: str, record: InstanceRecord, entry: Entry) -> None:
        if entry.lease == 0:
            known = instance_id in self.records  # its instance writes it back; deleting it would look like its end
            log.warning("registry: ignoring %s's record: written without a lease, so no instance's%s",
                        instance_id, "" if known else "; deleting it")  # fmt: skip
            if not known:
                self.cleanup.delete(entry, "an instance record without a lease is no instance's")
            return
        self.records[instance_id] = record
        handle = self.router.registry.instances.get(instance_id)
        if handle is not None and handle.is_alive and self._names(record, handle):
            self._cancel_join(instance_id)  # the record names the process served (again)
            self._ask_role(handle, record)
            return
        self._cancel_join(instance_id)
        task = asyncio.get_running_loop().create_task(self._join(instance_id, record))
        self._joining[instance_id] = task
        task.add_done_callback(
            lambda t: self._joining.pop(instance_id, None) if self._joining.get(instance_id) is t else None
        )

    @staticmethod
    def _names(record: InstanceRecord, handle: InstanceHandle) -> bool:
        return handle.address == (record.host, record.port) and handle.welcome.start_nonce == record.start_nonce

    def _cancel_join(self, instance_id: str) -> None:
        task = self._joining.pop(instance_id, None)
        if task is not None:
            task.cancel()

    async def _join(self, instance_id: str, record: InstanceRecord) -> None:
        """Connect to the instance `record` names, retrying while the record stays."""
        identity = InstanceIdentity(instance_id, record.start_nonce)
        delay, tries, wrong = JOIN_RETRY_FIRST_S, 0, 0
        while self.records.get(instance_id) is record:
            try:
                handle = await self.router.links.connect(record.host, record.port, JOIN_TIMEOUT_S, identity=identity)
            except IncompatibleInstance as exc:
                log.error("registry: not using %s: %s", instance_id, exc)
                return
            except WrongInstance as exc:
                self.num_wrong_instance += 1
                wrong += 1
                level = logging.WARNING if wrong == 1 else logging.DEBUG
                log.log(level, "registry: not using %s's record (try %d): %s", instance_id, wrong, exc)
                delay = WRONG_RETRY_FIRST_S if wrong == 1 else min(2 * delay, WRONG_RETRY_MAX_S)
                await asyncio.sleep(delay)  # backoff while another process answers at the record's address
                continue
            except (NotSettled, *REDIAL_ERRORS) as exc:
                tries += 1
                level = logging.WARNING if tries == 1 else logging.DEBUG
                log.log(level, "registry: connecting to %s at %s:%d (try %d): %s",
                        instance_id, record.host, record.port, tries, exc)  # fmt: skip
                await asyncio.sleep(delay)  # backoff while the instance does not answer
                delay = min(2 * delay, JOIN_RETRY_MAX_S)
                continue
            if self._claimed(instance_id):
                handle.draining = True
            self._ask_role(handle, record)
            return

    def _ask_role(self, handle: InstanceHandle, record: InstanceRecord) -> None:
        """A record at a newer role epoch: the handle takes the role the instance reports."""
        if record.epoch > handle.epoch:
            task = asyncio.get_running_loop().create_task(self._poll_role(handle))
            self._polls.add(task)
            task.add_done_callback(self._polls.discard)

    async def _poll_role(self, handle: InstanceHandle) -> None:
        try:
            handle.set_stats(await handle.channel.call(GetStats(), self.router.config.stats_timeout_s))
        except (ChannelClosed, TimeoutError, RemoteError):
            return  # the periodic stats poll brings it
        log.info("registry: %s is a %s instance at epoch %d", handle.instance_id, handle.role.value, handle.epoch)

    def delete(self, instance_id: str) -> None:
        record = self.records.pop(instance_id, None)
        self._cancel_join(instance_id)
        if record is None:
            return
        address = (record.host, record.port)
        if not any((r.host, r.port) == address for r in self.records.values()):  # a forged record may name another's
            self.router.links.forget(address)
        handle = self.router.registry.instances.get(instance_id)
        if handle is not None and handle.address == address:
            self.router.links.evict(handle, "its registry key is gone (its lease expired, or it shut down)")

    async def wait(self, timeout: float) -> None:
        """Wait for the joins under way (bounded)."""
        if self._joining:
            await asyncio.wait(list(self._joining.values()), timeout=timeout)

    def close(self) -> None:
        for task in [*self._joining.values(), *self._polls]:
            task.cancel()
