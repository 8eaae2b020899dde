"""`minipd --role cluster`: the launcher's run, from its configs to its exit status.

`prepare_cluster` loads the router's tokenizer (a bad --model fails before any process
starts) and returns `run_cluster`, which starts the `ProcessCluster`, prints where it serves,
answers the `--prompt`s or serves until Ctrl-C while its `Supervisor` restarts the children
that die, and stops every process. Signals (`LauncherSignals`): the first SIGINT or SIGTERM
stops the cluster gracefully; every later one kills every child at once, and the launcher
exits 1, never before its children are gone. A child that fails to start, or that dies more
often than `--max-restarts` allows (any death under `--exit-on-child-failure`), ends the run
with one line on stderr naming it, and status 1.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine

from minipd.engine.model_loader import load_tokenizer_only
from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.configs import RoleConfigs
from minipd.entrypoints.cpu_plan import ROUTER
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.entrypoints.prompt_demo import answer_prompts, chat_wrapper
from minipd.entrypoints.stop_signal import LauncherSignals, settle_heap
from minipd.entrypoints.supervisor import Supervisor

_STOPPED = object()


def prepare_cluster(configs: RoleConfigs) -> Coroutine:
    """`minipd --role cluster`: the run of the cluster its validated configs describe (the
    router's tokenizer is loaded first, so a bad --model fails before any process starts)."""
    tokenizer = load_tokenizer_only(configs.serving.model)
    demo = configs.demo
    return run_cluster(_launcher(configs), demo.prompts, demo.sampling, chat_wrapper(tokenizer) if demo.chat else None)


def _launcher(configs: RoleConfigs) -> ProcessCluster:
    """The cluster `--launcher` names; ValueError (exit status 2) when `ray` is not installed."""
    if configs.cluster.launcher != "ray":
        return ProcessCluster(configs)
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ValueError(
            "launcher: --launcher ray needs the ray package: pip install 'minipd[ray]' (the ray extra)"
        ) from None
    from minipd.entrypoints.ray_cluster import RayCluster

    return RayCluster(configs)


async def run_cluster(
    cluster: ProcessCluster, prompts: list[str], params: SamplingParams, wrap: Callable[[str], str] | None = None
) -> int:
    """Start the cluster, print where it serves, answer `prompts` (each passed through `wrap`
    first, when given) or serve until Ctrl-C, supervising the children all along, then stop
    every process. The first SIGINT or SIGTERM stops gracefully; each later one kills every
    child at once (status 1). A child that fails to start, or dies past `--max-restarts`,
    ends the run with one line saying so (status 1)."""

    def stopping() -> None:
        print(
            "minipd cluster: stopping every process gracefully; a second Ctrl-C or SIGTERM kills them at once",
            file=sys.stderr,
            flush=True,
        )

    def escalate() -> None:
        print(
            "minipd cluster: stop signal again: killing every process now (requests under way are aborted)",
            file=sys.stderr,
            flush=True,
        )
        cluster.kill_all()

    with LauncherSignals(stopping, escalate) as signals:
        try:
            status = await _serve(cluster, prompts, params, wrap, signals.stop)
        except RuntimeError as exc:
            print(f"minipd cluster: {exc}", file=sys.stderr, flush=True)
            status = 1
        finally:
            await cluster.stop()
    return 1 if signals.count > 1 else status


async def _serve(
    cluster: ProcessCluster,
    prompts: list[str],
    params: SamplingParams,
    wrap: Callable[[str], str] | None,
    stop: asyncio.Event,
) -> int:
    for line in cluster.placement_lines():
        print(line, flush=True)
    if await _unless_stopped(cluster.start(), stop) is _STOPPED:
        return 0
    host, port = cluster.router_address
    roles = ", ".join(f"{c.name} at {c.address[0]}:{c.address[1]} (pid {c.process.pid})" for c in cluster.children[:-1])
    print(f"cluster ready ({cluster.configs.transport.name} KV transport): {roles}", flush=True)
    for line in cluster.ready_lines():
        print(line, flush=True)
    print(
        f"router: {host}:{port} (pid {cluster.child(ROUTER).process.pid})  (Python: await "
        f"minipd.ClusterClient.connect({host!r}, {port}, secret=os.environ['MINIPD_CLUSTER_SECRET']))",
        flush=True,
    )
    if cluster.secret_generated:
        print(
            "the cluster secret was generated for this run and is known only to its processes; to connect "
            "clients of your own, start the cluster with MINIPD_CLUSTER_SECRET set",
            flush=True,
        )
    for line in cluster.child(ROUTER).announcements:
        print(line, flush=True)
    supervisor = Supervisor(cluster, cluster.configs.cluster)
    if prompts:
        client = await cluster.client()
        try:
            answered = await _unless_stopped(answer_prompts(client, prompts, params, wrap=wrap), stop, supervisor.run())
            return 0 if answered is _STOPPED else answered
        finally:
            await client.close()
    print("serving; Ctrl-C stops every process", flush=True)
    settle_heap()
    await _unless_stopped(supervisor.run(), stop)
    return 0


async def _unless_stopped(main: Coroutine, stop: asyncio.Event, *watchers: Coroutine):
    """`main`'s result, or `_STOPPED` once `stop` is set first; a watcher that raises (the
    supervisor giving up) raises here. What is left is cancelled."""
    tasks = [asyncio.ensure_future(c) for c in (main, stop.wait(), *watchers)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for watcher in tasks[2:]:
            if watcher.done():
                watcher.result()
        return tasks[0].result() if tasks[0].done() else _STOPPED
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
