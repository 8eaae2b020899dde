"""What a process trusts in the registry, without etcd: which switch claims a router honours
(claim_view.py: only those under the live lease of the router they name), when a process
writes its own key back (own_key.py: anyone else's change or delete, not its own writes'
events), and the TLS and login settings checked at start, each naming its flag. The same
against a real etcd and real processes: tests/processes/test_registry_forgery.py and
test_registry_etcd_security.py."""

from __future__ import annotations

import asyncio
import types

import pytest

from minipd.control.role import Role
from minipd.entrypoints.configs import role_configs
from minipd.entrypoints.flags import build_parser
from minipd.ops.registry.claim_view import ClaimView
from minipd.ops.registry.etcd_url import ETCD_PASSWORD_ENV
from minipd.ops.registry.own_key import OwnKey
from minipd.ops.registry.records import SwitchClaim
from minipd.ops.registry.watcher import Entry

ME, OTHER = "router-me", "router-other"


class FakeClaims:
    router_name = ME

    def __init__(self, holds: set[str]):
        self._holds = holds

    def holds(self, instance_id: str) -> bool:
        return instance_id in self._holds


class FakeCleanup:
    def __init__(self) -> None:
        self.deleted: list[bytes] = []

    def delete(self, entry: Entry, why: str) -> None:
        self.deleted.append(entry.key)


def claim_view(holds: set[str] = frozenset()) -> tuple[ClaimView, FakeCleanup, list]:
    cleanup, changes = FakeCleanup(), []
    view = ClaimView(FakeClaims(set(holds)), cleanup, lambda i, honoured: changes.append((i, honoured)))
    view.router_put(ME, Entry(b"/p/routers/" + ME.encode(), b"{}", lease=10, mod_revision=1))
    view.router_put(OTHER, Entry(b"/p/routers/" + OTHER.encode(), b"{}", lease=20, mod_revision=2))
    return view, cleanup, changes


def put_claim(view: ClaimView, instance_id: str, router: str, lease: int, revision: int = 5) -> None:
    claim = SwitchClaim(instance_id=instance_id, router=router, from_epoch=0, to_role=Role.PREFILL)
    view.claim_put(instance_id, claim, Entry(f"/p/switches/{instance_id}".encode(), b"{}", lease, revision))


@pytest.mark.parametrize(
    "router, lease, holds, why",
    [
        (OTHER, 0, (), "written without a lease"),
        (OTHER, 99, (), "is not the lease of router 'router-other'"),
        ("router-gone", 20, (), "not in the registry"),
        (ME, 10, (), "names this router, which does not hold it"),
        (OTHER, 20, (), None),
        (ME, 10, ("d0",), None),
    ],
)
def test_a_claim_is_honoured_only_under_the_live_lease_of_the_router_it_names(router, lease, holds, why):
    view, cleanup, changes = claim_view(set(holds))
    claim = SwitchClaim(instance_id="d0", router=router, from_epoch=0, to_role=Role.PREFILL)
    refused = view.why_refused(claim, Entry(b"/p/switches/d0", b"{}", lease, 5))
    assert (refused is None) if why is None else (why in refused), refused
    put_claim(view, "d0", router, lease)
    assert ("d0" in view.honoured) == (why is None)
    assert cleanup.deleted == ([] if why is None else [b"/p/switches/d0"])
    assert changes == ([("d0", True)] if why is None else [])


def test_claims_are_judged_again_when_their_router_goes_or_changes_lease():
    view, cleanup, changes = claim_view()
    put_claim(view, "d0", OTHER, 20)
    view.router_put(OTHER, Entry(b"/p/routers/" + OTHER.encode(), b"{}", lease=21, mod_revision=7))
    assert "d0" not in view.honoured and cleanup.deleted == [b"/p/switches/d0"]
    put_claim(view, "d1", OTHER, 21)
    view.router_deleted(OTHER)
    assert view.honoured == {} and changes == [("d0", True), ("d0", False), ("d1", True), ("d1", False)]


class FakeClient:
    def __init__(self) -> None:
        self.puts: list[tuple[bytes, bytes, int]] = []

    async def put(self, key: bytes, value: bytes, lease: int):
        self.puts.append((key, value, lease))
        return types.SimpleNamespace(header=types.SimpleNamespace(revision=100 + len(self.puts)))


def test_a_process_writes_its_key_back_when_someone_else_changes_or_deletes_it():
    client = FakeClient()
    endpoints = types.SimpleNamespace(client=client)
    key = b"/p/instances/d0"

    async def scenario() -> list:
        own = OwnKey(endpoints, key, lambda: b"mine", "d0")
        own.session = types.SimpleNamespace(lease_id=7, ttl_s=3, mark_unpublished=lambda: None)
        await own.write(7)
        own.seen(Entry(key, b"mine", 7, 101))  # the event of our own write
        own.seen(Entry(key, b"mine", 7, 150))  # our value under our lease, whoever wrote it
        own.put(Entry(key + b"1", b"other", 0, 151))  # another key (d01) under the prefix watched
        await asyncio.sleep(0)
        written = len(client.puts)
        own.seen(Entry(key, b"forged", 0, 152))  # overwritten: written back at once
        await asyncio.sleep(0)
        own.delete(key)  # deleted right after: written back after a backoff
        deadline = asyncio.get_running_loop().time() + 2.0
        while len(client.puts) < 3:
            assert asyncio.get_running_loop().time() < deadline, client.puts
            await asyncio.sleep(0.01)  # polling for the write, bounded by the deadline
        await own.close()
        return [written, len(client.puts), own.num_rewrites]

    assert asyncio.run(scenario()) == [1, 3, 2]
    assert client.puts[-1] == (key, b"mine", 7)


def configs(*argv: str):
    return role_configs(Role.ROUTER, build_parser(Role.ROUTER).parse_args(["--role", "router", *argv]))


def test_tls_and_login_settings_are_checked_at_start(tmp_path, monkeypatch):
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "client.pem", "client.key"))
    for path in (ca, cert, key):
        path.write_text("PEM")
    url = ["--registry", "etcd://127.0.0.1:2379"]
    tls = configs(*url, "--registry-ca", str(ca), "--registry-cert", str(cert), "--registry-key", str(key))
    assert tls.process.registry.tls.enabled and tls.process.registry.tls.cert == str(cert)
    assert not configs(*url).process.registry.tls.enabled
    with pytest.raises(ValueError, match="registry_ca: .* need --registry"):
        configs("--registry-ca", str(ca))
    with pytest.raises(ValueError, match="registry_cert: --registry-cert and --registry-key go together"):
        configs(*url, "--registry-cert", str(cert))
    with pytest.raises(ValueError, match="registry_ca: cannot read"):
        configs(*url, "--registry-ca", str(tmp_path / "missing.pem"))
    monkeypatch.delenv(ETCD_PASSWORD_ENV, raising=False)
    with pytest.raises(ValueError, match=f"logs in as 'minipd'; set its password in \\${ETCD_PASSWORD_ENV}"):
        configs("--registry", "etcd://minipd@127.0.0.1:2379")
    monkeypatch.setenv(ETCD_PASSWORD_ENV, "pw")
    assert configs("--registry", "etcd://minipd@127.0.0.1:2379").process.registry.user == "minipd"
