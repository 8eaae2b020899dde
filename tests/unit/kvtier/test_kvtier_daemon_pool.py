"""The daemon pool: calls run in daemon threads, a call cancelled while queued never runs, and
`done` comes when the thread is through with a call, not when its await ends."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from minipd.kvtier.daemon_pool import DaemonPool

WAIT_S = 10.0


def test_a_timed_out_call_reports_done_only_when_its_thread_is():
    async def scenario():
        pool = DaemonPool(1, "test")
        release, done = threading.Event(), threading.Event()
        ran_after = []
        try:
            try:
                await asyncio.wait_for(pool.call(release.wait, WAIT_S, done=done.set), 0.05)
            except asyncio.TimeoutError:
                pass
            assert not done.is_set()  # the thread still runs the call
            queued = asyncio.ensure_future(pool.call(ran_after.append, "queued"))
            await asyncio.sleep(0)  # let it be queued behind the stuck call
            queued.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await queued  # cancelled (and its queued call with it) before the stuck call ends
            release.set()
            assert await asyncio.to_thread(done.wait, WAIT_S)
            assert await pool.call(lambda: "next") == "next"
            assert ran_after == []  # cancelled while queued: never ran
        finally:
            release.set()
            pool.shutdown()

    asyncio.run(scenario())


def test_workers_are_daemons_and_errors_reach_the_caller():
    async def scenario():
        pool = DaemonPool(2, "test")
        try:
            assert all(t.daemon for t in pool._threads)
            try:
                await pool.call(int, "not a number")
            except ValueError as exc:
                return exc
        finally:
            pool.shutdown()

    assert isinstance(asyncio.run(scenario()), ValueError)


def test_a_shut_down_pool_still_reports_done():
    async def scenario():
        pool = DaemonPool(1, "test")
        pool.shutdown()
        done = threading.Event()
        try:
            await pool.call(print, done=done.set)
        except RuntimeError:
            return done.is_set()

    assert asyncio.run(scenario())


def test_idle_only_once_no_call_is_queued_or_running():
    pool = DaemonPool(1, "test")
    release = threading.Event()
    try:
        stuck = pool.submit(release.wait, WAIT_S)
        queued = pool.submit(lambda: None)
        assert not pool.wait_idle(0.05)
        release.set()
        assert pool.wait_idle(WAIT_S) and stuck.result() and queued.done()
    finally:
        release.set()
        pool.shutdown()
