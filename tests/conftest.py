"""Fixtures: one background event loop per session, engines that are checked for leaks after every
test; and the `fast` marker, set on every test under tests/unit/ (no child processes, no clusters,
tiny models): `pytest tests/unit`, or `pytest -m fast`, runs them in well under 30 s, for a quick
check while editing. CI runs everything.

The whole suite (`python -m pytest -q`, no paths) runs on two pytest-xdist workers: most of its
time is spent waiting on other processes (servers starting, liveness bounds, leases, pages
polling), so two workers use a 2-core machine's second core where one would leave it idle.
Each test module stays on one worker (its module-scoped clusters start once), and the tests that
make machine-wide things (network namespaces, Ray nodes) share one worker. `-n N` chooses
otherwise, `-n 0` runs serially; `MINIPD_TEST_WORKERS=N` sets the whole suite's count. A run of
named paths stays serial unless `-n` says otherwise."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from loop_thread import LoopThread

from minipd.engine.engine import Engine, EngineConfig

_live_engines: list[Engine] = []

TESTS_DIR = Path(__file__).resolve().parent
FAST_DIR = TESTS_DIR / "unit"
SUITE_WORKERS = 2
# modules that make machine-wide things: one worker runs them all, one after the other
MACHINE_WIDE = ("test_netns_", "test_ray_", "test_bench_scale")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "fast: in the quick subset (`pytest -m fast`): every test under tests/unit/")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config) -> None:
    """A run of the whole suite goes on SUITE_WORKERS xdist workers, grouped (see the docstring)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.pluginmanager.hasplugin("xdist"):
        return
    if config.option.numprocesses is not None or config.option.collectonly:
        return  # the caller chose (-n), or nothing runs
    whole_suite = all(Path(arg).resolve() == TESTS_DIR for arg in config.args)
    if not whole_suite:
        return
    workers = int(os.environ.get("MINIPD_TEST_WORKERS", SUITE_WORKERS))
    if workers > 1:
        # every worker must collect the same tests in the same order: one string hash seed for all
        # (chosen at random per run, as Python's own is), so nothing ordered by a set's iteration differs
        os.environ.setdefault("PYTHONHASHSEED", str(random.randrange(1, 2**32)))
        config.option.numprocesses, config.option.dist = workers, "loadscope"
        config.option.tx = ["popen"] * workers


def worker_group(nodeid: str) -> str:
    """The group of tests one xdist worker runs one after the other: the test's module, or
    "machine-wide" for the modules that make machine-wide things."""
    path = nodeid.split("::", 1)[0]
    return "machine-wide" if Path(path).name.startswith(MACHINE_WIDE) else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Any load-balancing `--dist` keeps each `worker_group` on one worker. A scheduler of our own
    rather than `xdist_group` marks: xdist writes those into a node id attribute pytest 9.2 no
    longer reads, and a module split across two workers starts its module fixtures twice."""
    if config.getoption("dist") == "each":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkerGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return ByWorkerGroup(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.path.resolve().is_relative_to(FAST_DIR):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="session")
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="module")
def redis_store():
    """A real redis-server for one module's KV tier cluster (redis_server.py; a module using it
    skips on `kvtier_stores.redis_missing()` itself)."""
    from redis_server import running_redis

    with running_redis() as server:
        yield server


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
