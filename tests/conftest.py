"""Fixtures: one background event loop per session, engines that are checked for leaks after every
test; and the `fast` marker, set on every test under tests/unit/ (no child processes, no clusters,
tiny models): `pytest tests/unit`, or `pytest -m fast`, runs them in well under 30 s, for a quick
check while editing. CI runs everything."""

from __future__ import annotations

from pathlib import Path

import pytest
from loop_thread import LoopThread

from minipd.engine.engine import Engine, EngineConfig

_live_engines: list[Engine] = []

FAST_DIR = Path(__file__).resolve().parent / "unit"


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "fast: in the quick subset (`pytest -m fast`): every test under tests/unit/")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.path.resolve().is_relative_to(FAST_DIR):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="session")
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="session")
def make_engine(loop_thread):
    """Build and start an engine on the shared loop; every one is closed at the end of the session."""
    engines: list[Engine] = []

    def factory(**overrides) -> Engine:
        async def build() -> Engine:
            engine = Engine(EngineConfig.of(**overrides))
            await engine.start()
            return engine

        engine = loop_thread.run(build())
        engines.append(engine)
        _live_engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        loop_thread.run(engine.close())
        _live_engines.remove(engine)


@pytest.fixture(autouse=True)
def pools_back_to_full(loop_thread):
    """After every test, every live engine has no requests and all of its blocks free."""
    yield
    for engine in _live_engines:
        stats = loop_thread.run(_settled_stats(engine))
        assert stats.num_running == 0 and stats.num_waiting == 0, f"requests left behind: {stats}"
        assert stats.blocks.num_free == stats.blocks.num_blocks, f"blocks leaked: {stats.blocks}"


IDLE_TIMEOUT_S = 10.0


async def _settled_stats(engine: Engine):
    await engine.wait_idle(IDLE_TIMEOUT_S)  # aborts are applied by the engine loop
    return engine.stats()
