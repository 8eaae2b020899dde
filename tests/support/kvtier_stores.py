"""The stores the KV tier's conformance suite runs against, behind one face: open a tier on the
store, reach its values raw (to corrupt them as a fault would), and kill, restart, freeze and
thaw the store itself. `fake` is the in-process dict; `redis` a real redis-server; `mooncake` a
real mooncake_master, started by the tier's own supervisor. Each is made once per test module."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import tempfile

from redis_server import REDIS, RedisServer

from minipd.kvtier.fake_backend import FakeBackend
from minipd.kvtier.mooncake_master import MooncakeMaster
from minipd.kvtier.open_tier import open_kv_tier
from minipd.kvtier.tier import KVTier, TierSettings

BLOCK_SIZE = 16
TIMEOUT_S = 1.0
SETTINGS = TierSettings(timeout_s=TIMEOUT_S, setup_timeout_s=30.0)
# Small segments: each client contributes one to the store, and the machine is shared.
MOONCAKE_QUERY = "?segment_mib=128&staging_mib=32"
# The tests of the tier's mechanics fetch whatever it has: the tiny model computes a block faster
# than a store returns it, so the fetch-or-recompute choice would compute (tested on its own:
# tests/unit/kvtier/test_fetch_cost.py, tests/unit/disagg/test_tier_wire.py).
ALWAYS_FETCH = ("--kv-tier-fetch", "always")


def mooncake_missing() -> str | None:
    """Why the Mooncake store cannot run here (None: it can)."""
    if importlib.util.find_spec("mooncake") is None:
        return "mooncake is not installed: pip install -e '.[kvtier]'"
    try:
        import mooncake.store  # noqa: F401 - its library needs libibverbs1 even without RDMA
    except ImportError as exc:
        return f"mooncake's client does not load ({exc}); .ci/run installs libibverbs1"
    return None


def redis_missing() -> str | None:
    if importlib.util.find_spec("redis") is None:
        return "redis (redis-py) is not installed: pip install -e '.[kvtier]'"
    if not os.path.exists(REDIS):
        return "redis-server is not installed (.ci/run installs it)"
    return None


class StoreEnv:
    name: str

    async def open(self, model_digest: bytes) -> KVTier:
        return await open_kv_tier(self.url, model_digest, BLOCK_SIZE, SETTINGS)

    async def raw_get(self, tier: KVTier, key: str) -> bytes | None:
        raise NotImplementedError

    async def raw_put(self, tier: KVTier, key: str, value: bytes) -> None:
        """Replace whatever is under `key` with `value`, bypassing the tier."""
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        raise NotImplementedError

    def freeze(self) -> None:
        raise NotImplementedError

    def thaw(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class FakeEnv(StoreEnv):
    name = "fake"

    def __init__(self) -> None:
        self.backend = FakeBackend()  # shared by every tier opened here, as a real store is

    async def open(self, model_digest: bytes) -> KVTier:
        return KVTier(self.backend, model_digest, BLOCK_SIZE, SETTINGS)

    async def raw_get(self, tier: KVTier, key: str) -> bytes | None:
        return self.backend.values.get(key)

    async def raw_put(self, tier: KVTier, key: str, value: bytes) -> None:
        self.backend.values[key] = value

    def kill(self) -> None:
        self.backend.down = True

    def restart(self) -> None:
        self.backend.values.clear()
        self.backend.down = False

    def freeze(self) -> None:
        self.backend.freeze()

    def thaw(self) -> None:
        self.backend.thaw()


class ServerEnv(StoreEnv):
    """A store that is a child process (`server`: `start`, `kill`, `process`)."""

    server: RedisServer | MooncakeMaster

    def kill(self) -> None:
        self.server.kill()

    def restart(self) -> None:
        self.server.start()

    def freeze(self) -> None:
        os.kill(self.server.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.server.process.pid, signal.SIGCONT)


class RedisEnv(ServerEnv):
    name = "redis"

    def __init__(self) -> None:
        self.server = RedisServer()
        self.server.start()
        self.url = self.server.url

    async def raw_get(self, tier: KVTier, key: str) -> bytes | None:
        return await tier.backend.client.get(key)

    async def raw_put(self, tier: KVTier, key: str, value: bytes) -> None:
        await tier.backend.client.set(key, value)

    def close(self) -> None:
        self.server.close()


class MooncakeEnv(ServerEnv):
    name = "mooncake"

    def __init__(self) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="minipd-mooncake-master-", suffix=".log", delete=False)
        self.server = MooncakeMaster(log_path=self.log.name)
        self.server.start()
        self.url = self.server.url + MOONCAKE_QUERY

    async def raw_get(self, tier: KVTier, key: str) -> bytes | None:
        value = await asyncio.to_thread(tier.backend.client.get, key)
        return value or None

    async def raw_put(self, tier: KVTier, key: str, value: bytes) -> None:
        client = tier.backend.client

        def replace() -> None:
            client.batch_remove([key], True)  # forced: a put over an existing key does nothing
            code = client.put(key, value)
            assert code == 0, f"raw put of {key} failed ({code})"

        await asyncio.to_thread(replace)

    def close(self) -> None:
        if self.server.process is not None:
            os.kill(self.server.process.pid, signal.SIGCONT)
        self.server.stop()
        os.unlink(self.log.name)


ENVS = {
    "fake": (FakeEnv, lambda: None),
    "redis": (RedisEnv, redis_missing),
    "mooncake": (MooncakeEnv, mooncake_missing),
}
