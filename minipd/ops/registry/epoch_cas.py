"""Role switches claimed in the registry, so that two routers cannot both switch an instance.

A router that wants to switch instance ID away from the role epoch E it knows runs one etcd
transaction: it succeeds only if `P/instances/ID` is unchanged since the router read it
there at epoch E (compare its mod revision) and no claim `P/switches/ID` exists (compare its
create revision with 0), and then puts the claim (`SwitchClaim`: epoch E to E+1, the new
role, the router's name) under the router's own lease, the one its registry record
`P/routers/NAME` is under (routers honour no other claim: claim_view.py). Exactly one of
several routers asking at once wins; the others raise SwitchConflict (HTTP 409, naming the
winner). The winner sends `SwitchRole` with epoch E as before: the instance bumps its epoch
to E+1 itself and publishes it (publisher.py), and still refuses a stale epoch. Once the
switch ended, either way, the claim is deleted (retried until etcd answers); a router that
dies while holding one leaves it to its lease, which expires within the TTL. Routers that
see a claim they honour stop sending the instance new work until it is gone
(router_membership.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from minipd.control.role import Role
from minipd.ops.registry.etcd_client import ETCD_ERRORS, EtcdEndpoints
from minipd.ops.registry.records import BadRecord, RegistryKeys, SwitchClaim, decode_claim, decode_instance, encode
from minipd.ops.registry.session import LeaseSession
from minipd.router.role_switch_driver import SwitchConflict, SwitchFailed

log = logging.getLogger(__name__)

RELEASE_RETRY_S = 0.5


class EtcdSwitchClaims:
    def __init__(self, endpoints: EtcdEndpoints, keys: RegistryKeys, session: LeaseSession, router_name: str):
        self.endpoints, self.keys, self.session, self.router_name = endpoints, keys, session, router_name
        self.held: set[str] = set()  # instance ids this router is switching now
        self._taking: set[str] = set()  # instance ids whose claim this router's transaction is writing
        self._releasing: set[asyncio.Task] = set()

    def holds(self, instance_id: str) -> bool:
        """Whether a claim on `instance_id` naming this router is this router's (claim_view.py)."""
        return instance_id in self.held or instance_id in self._taking

    @contextlib.asynccontextmanager
    async def claim(self, instance_id: str, epoch: int, target: Role):
        revision = await self._take(instance_id, epoch, target)
        self.held.add(instance_id)
        try:
            yield
        finally:
            self.held.discard(instance_id)
            task = asyncio.get_running_loop().create_task(self._release(instance_id, revision))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def _take(self, instance_id: str, epoch: int, target: Role) -> int:
        """Claim the switch; returns the claim's revision."""
        client = self.endpoints.client
        instance_key, claim_key = self.keys.instance(instance_id), self.keys.switch(instance_id)
        try:
            current = await client.get(instance_key)
            if current is None:
                raise SwitchConflict("instance", f"{instance_id} is not in the registry (its lease expired?)")
            try:
                record = decode_instance(instance_id, current.value)
            except BadRecord as exc:
                raise SwitchConflict("instance", f"{instance_id}'s registry record is unusable: {exc}") from None
            if record.epoch != epoch:
                raise SwitchConflict(
                    "instance",
                    f"{instance_id} is at role epoch {record.epoch} in the registry, not {epoch}: it was switched "
                    "meanwhile",
                )
            claim = SwitchClaim(instance_id=instance_id, router=self.router_name, from_epoch=epoch, to_role=target)
            self._taking.add(instance_id)
            try:
                won, responses = await client.transaction(
                    compare=[
                        client.transactions.mod(instance_key) == current.mod_revision,
                        client.transactions.create(claim_key) == 0,
                    ],
                    success=[client.transactions.put(claim_key, encode(claim), lease=self.session.lease_id)],
                    failure=[client.transactions.get(claim_key)],
                )
            finally:
                self._taking.discard(instance_id)
        except ETCD_ERRORS as exc:
            raise SwitchFailed(
                f"{instance_id} was not switched: the registry is unreachable: {exc}", "registry"
            ) from exc
        if not won:
            raise SwitchConflict(
                "instance", f"{instance_id} is being switched by {self._holder(instance_id, responses)}"
            )
        log.info("%s: claimed the switch of %s from epoch %d to %s", self.router_name, instance_id, epoch, target.value)
        return responses[0].response_put.header.revision

    @staticmethod
    def _holder(instance_id: str, responses) -> str:
        """Who holds the claim, from the failed transaction's read of it."""
        for found in responses:
            for value, _ in found if isinstance(found, list) else []:
                try:
                    return f"router {decode_claim(instance_id, value).router!r}"
                except BadRecord:
                    return "another router"
        return "another router (its registry record changed meanwhile)"

    async def _release(self, instance_id: str, revision: int) -> None:
        """Delete our claim (only ours: one created at `revision`; if our lease ran out and
        another router claimed since, its claim stays)."""
        claim_key = self.keys.switch(instance_id)
        while True:
            try:
                client = self.endpoints.client
                await client.transaction(
                    compare=[client.transactions.create(claim_key) == revision],
                    success=[client.transactions.delete(claim_key)],
                    failure=[],
                )
                return
            except ETCD_ERRORS as exc:
                log.warning(
                    "%s: releasing the switch claim on %s failed (retrying): %s", self.router_name, instance_id, exc
                )
                await asyncio.sleep(RELEASE_RETRY_S)  # etcd unreachable: try again

    async def close(self) -> None:
        """Wait briefly for claims being released (the lease's revocation ends any left)."""
        if self._releasing:
            await asyncio.wait(list(self._releasing), timeout=self.endpoints.call_timeout_s)
        for task in list(self._releasing):
            task.cancel()
