"""The launcher's supervision policy, over stand-in children (no processes): a death is
restarted with a growing backoff, up to `max_restarts` in a row, counting a restart that
failed; past that cap, or at once under `exit_on_child_failure`, `ChildFailed` names the
child; a child that served `stable_after_s` counts from 0 again. How a process ended reads
as its exit status or its signal."""

from __future__ import annotations

import asyncio
import itertools
import signal
from typing import NamedTuple

import pytest

from minipd.entrypoints import supervisor
from minipd.entrypoints.config_sections import ClusterConfig
from minipd.entrypoints.supervisor import ChildFailed, Supervisor, backoff_s, exit_text

WAIT_S = 5.0


class FakeProcess:
    _pids = itertools.count(100)

    def __init__(self) -> None:
        self.pid = next(self._pids)
        self.returncode: int | None = None
        self._exited = asyncio.Event()

    def die(self, returncode: int) -> None:
        self.returncode = returncode
        self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        return self.returncode


class FakeChild(NamedTuple):
    name: str
    process: FakeProcess
    address: tuple[str, int] = ("127.0.0.1", 1)


class FakeCluster:
    """Children that die when told to; `restart` fails while `failures` says so."""

    def __init__(self, *names: str) -> None:
        self.children = [FakeChild(name, FakeProcess()) for name in names]
        self.failures = 0
        self.restarted = asyncio.Queue()
        self.children_changed = asyncio.Event()

    def child(self, name: str) -> FakeChild:
        return next(c for c in self.children if c.name == name)

    async def restart(self, name: str) -> FakeChild:
        if self.failures:
            self.failures -= 1
            raise RuntimeError(f"{name} failed to start (exit status 1): it could not")
        old = self.child(name)
        new = FakeChild(name, FakeProcess())
        self.children[self.children.index(old)] = new
        self.restarted.put_nowait(new)
        return new


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(supervisor, "BACKOFF_FIRST_S", 0.001)


def test_exit_text_names_the_status_or_the_signal():
    assert exit_text(3) == "exit status 3"
    assert exit_text(-signal.SIGKILL) == "killed by SIGKILL"


def test_the_backoff_doubles_up_to_its_cap():
    assert [backoff_s(n) for n in range(3)] == [0.001, 0.002, 0.004]
    assert backoff_s(60) == supervisor.BACKOFF_MAX_S


def test_a_dead_child_is_restarted_and_then_watched_again(capsys):
    async def scenario():
        cluster = FakeCluster("decode-0", "router")
        watch = asyncio.ensure_future(Supervisor(cluster, ClusterConfig(max_restarts=3)).run())
        first = cluster.child("decode-0").process
        first.die(-signal.SIGKILL)
        second = await asyncio.wait_for(cluster.restarted.get(), WAIT_S)
        second.process.die(1)  # the restarted one is watched too
        third = await asyncio.wait_for(cluster.restarted.get(), WAIT_S)
        watch.cancel()
        return first, second, third

    first, second, third = asyncio.run(scenario())
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"minipd cluster: decode-0 (pid {first.pid}) died (killed by SIGKILL); restarting")
    assert lines[1].startswith(f"minipd cluster: decode-0 restarted (pid {second.process.pid})")
    assert lines[2].startswith(f"minipd cluster: decode-0 (pid {second.process.pid}) died (exit status 1)")
    assert len({first.pid, second.process.pid, third.process.pid}) == 3


def test_past_the_cap_the_child_is_named_and_failed_restarts_count():
    async def scenario():
        cluster = FakeCluster("prefill-0", "router")
        cluster.failures = 2  # two restarts fail, so the cap of 2 is reached with no new child
        watch = asyncio.ensure_future(Supervisor(cluster, ClusterConfig(max_restarts=2)).run())
        cluster.child("prefill-0").process.die(-signal.SIGKILL)
        with pytest.raises(ChildFailed) as failed:
            await asyncio.wait_for(watch, WAIT_S)
        return str(failed.value), cluster.restarted.qsize()

    message, restarted = asyncio.run(scenario())
    assert "prefill-0 did not restart" in message and "--max-restarts 2" in message, message
    assert restarted == 0


def test_the_exit_flag_restarts_nothing():
    async def scenario():
        cluster = FakeCluster("decode-0", "router")
        watch = asyncio.ensure_future(Supervisor(cluster, ClusterConfig(exit_on_child_failure=True)).run())
        router = cluster.child("router").process
        router.die(-signal.SIGTERM)
        with pytest.raises(ChildFailed) as failed:
            await asyncio.wait_for(watch, WAIT_S)
        return str(failed.value), router.pid, cluster.restarted.qsize()

    message, pid, restarted = asyncio.run(scenario())
    assert message.startswith(f"router (pid {pid}) died (killed by SIGTERM)") and "--exit-on-child-failure" in message
    assert restarted == 0


def test_a_child_that_served_long_enough_counts_from_zero():
    async def scenario():
        cluster = FakeCluster("decode-0")
        config = ClusterConfig(max_restarts=1, stable_after_s=0.0)  # every child has served "long enough"
        watch = asyncio.ensure_future(Supervisor(cluster, config).run())
        for _ in range(3):  # three deaths, one restart allowed in a row: each is forgiven
            cluster.child("decode-0").process.die(1)
            await asyncio.wait_for(cluster.restarted.get(), WAIT_S)
        watch.cancel()

    asyncio.run(scenario())


def test_an_instance_added_is_watched_and_one_removed_is_not_restarted(capsys):
    async def scenario():
        cluster = FakeCluster("decode-0", "router")
        watch = asyncio.ensure_future(Supervisor(cluster, ClusterConfig(max_restarts=3)).run())
        await asyncio.sleep(0)  # the supervisor is watching the children it started with
        added = FakeChild("decode-1", FakeProcess())
        cluster.children.insert(1, added)  # as ProcessCluster.add_instance does
        cluster.children_changed.set()
        removed = cluster.child("decode-0")
        cluster.children.remove(removed)  # as ProcessCluster.remove_instance does, before stopping it
        cluster.children_changed.set()
        removed.process.die(0)
        added.process.die(1)
        restarted = await asyncio.wait_for(cluster.restarted.get(), WAIT_S)
        watch.cancel()
        return restarted, [c.name for c in cluster.children]

    restarted, names = asyncio.run(scenario())
    assert restarted.name == "decode-1" and names == ["decode-1", "router"]
    err = capsys.readouterr().err
    assert "decode-1" in err and "decode-0" not in err, err


def test_a_process_lost_with_its_actor_is_logged_with_that_reason(capsys):
    async def scenario():
        cluster = FakeCluster("decode-0", "router")
        lost = cluster.child("decode-0").process
        lost.exit_reason = "lost with its Ray actor: its node died"  # as RayProcess says it
        watch = asyncio.ensure_future(Supervisor(cluster, ClusterConfig(max_restarts=0)).run())
        lost.die(-signal.SIGKILL)
        with pytest.raises(ChildFailed) as failed:
            await asyncio.wait_for(watch, WAIT_S)
        return str(failed.value), lost.pid

    message, pid = asyncio.run(scenario())
    assert message.startswith(f"decode-0 (pid {pid}) died (lost with its Ray actor: its node died)"), message
