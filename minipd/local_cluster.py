"""`minipd --role cluster`: a whole local cluster as processes on this host.

Starts N prefill and M decode instances (`minipd --role prefill|decode`), waits for each to
print its READY line, starts the router pointed at them, and prints where to send requests.
With `--prompt`, answers the prompts through the client API (printing tokens, TTFT, ITL
and KV transfer figures) and shuts down; otherwise serves until Ctrl-C. Every child is
stopped on exit (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Callable, NamedTuple

import msgspec

from .client import ClusterClient
from .engine_args import engine_argv
from .local_demo import answer_prompts
from .sampling_params import SamplingParams

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0


class Child(NamedTuple):
    name: str
    process: asyncio.subprocess.Process
    address: tuple[str, int]
    announcements: list[str]  # lines it printed before READY (e.g. where its HTTP API listens)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    from minipd.transports.registry import BACKENDS

    g = parser.add_argument_group("local cluster")
    g.add_argument("--num-prefill", type=int, default=1, help="prefill instances (default: %(default)s)")
    g.add_argument("--num-decode", type=int, default=1, help="decode instances (default: %(default)s)")
    g.add_argument("--transport", default="tcp", choices=sorted(b for b in BACKENDS if b != "loopback"),
                   help="KV transfer backend between the instance processes (default: %(default)s)")
    g.add_argument("--link-gbps", type=float, default=None,
                   help="cap each prefill instance's KV egress, in gigabits per second (default: no cap)")
    g.add_argument("--host", default="127.0.0.1", help="address every process binds (default: %(default)s)")
    g.add_argument("--port", type=int, default=0,
                   help="the router's client port; 0 picks a free one (default: 0)")


class ClusterSpec(msgspec.Struct, kw_only=True):
    """What to start: every list is extra command-line flags for those processes."""

    num_prefill: int = 1
    num_decode: int = 1
    transport: str = "tcp"
    model: str = "tiny"
    engine_argv: list[str] = []  # engine flags for every instance (see engine_args.engine_argv)
    router_argv: list[str] = []  # routing-policy flags (and the router's HTTP flags)
    instance_argv: list[str] = []  # more instance flags (e.g. --lease-s)
    link_gbps: float | None = None
    host: str = "127.0.0.1"
    port: int = 0
    log_level: str = "WARNING"


class LocalCluster:
    """The processes of one local cluster; `start` then `stop` (also usable from tests)."""

    def __init__(self) -> None:
        self.children: list[Child] = []
        self.router_address: tuple[str, int] | None = None

    async def start(self, spec: ClusterSpec) -> None:
        common = ["--host", spec.host, "--transport", spec.transport, "--log-level", spec.log_level,
                  "--model", spec.model, *spec.engine_argv, *spec.instance_argv]
        if spec.link_gbps:
            common += ["--link-gbps", str(spec.link_gbps)]
        roles = [("prefill", i) for i in range(spec.num_prefill)] + [("decode", i) for i in range(spec.num_decode)]
        try:
            await asyncio.gather(*(self._spawn(f"{role}-{i}", ["--role", role, "--instance-id", f"{role}-{i}",
                                                               *common]) for role, i in roles))
            addresses = []
            for child in self.children:
                flag = "--prefill" if child.name.startswith("prefill") else "--decode"
                addresses += [flag, f"{child.address[0]}:{child.address[1]}"]
            router = await self._spawn("router", ["--role", "router", "--host", spec.host, "--port", str(spec.port),
                                                  "--model", spec.model, "--log-level", spec.log_level,
                                                  *spec.router_argv, *addresses])
        except BaseException:
            await self.stop()
            raise
        self.router_address = router.address

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    async def _spawn(self, name: str, argv: list[str]) -> Child:
        process = await asyncio.create_subprocess_exec(sys.executable, "-m", "minipd.cli", *argv,
                                                       stdout=asyncio.subprocess.PIPE)
        announcements: list[str] = []
        try:
            address = await asyncio.wait_for(self._wait_ready(name, process, announcements), READY_TIMEOUT_S)
        except BaseException:
            process.kill()
            await process.wait()
            raise
        child = Child(name, process, address, announcements)
        self.children.append(child)
        asyncio.get_running_loop().create_task(self._drain(child))
        return child

    @staticmethod
    async def _wait_ready(name: str, process: asyncio.subprocess.Process, announcements: list[str]
                          ) -> tuple[str, int]:
        while True:
            line = (await process.stdout.readline()).decode()
            if not line:
                raise RuntimeError(f"{name} exited with status {await process.wait()} before it was ready "
                                   "(its error is above)")
            if line.startswith("READY "):
                host, _, port = line.split()[-1].rpartition(":")
                return host, int(port)
            announcements.append(line.rstrip())

    @staticmethod
    async def _drain(child: Child) -> None:
        while await child.process.stdout.readline():
            pass

    async def stop(self) -> None:
        """Router first (so no new work reaches the instances), then the instances."""
        for child in reversed(self.children):
            if child.process.returncode is None:
                child.process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(child.process.wait(), STOP_GRACE_S)
                except asyncio.TimeoutError:
                    log.warning("%s did not stop in %s s; killing it", child.name, STOP_GRACE_S)
                    child.process.kill()
                    await child.process.wait()


async def run_cluster(args: argparse.Namespace, router_args: list[str], prompts: list[str],
                      params: SamplingParams, wrap: Callable[[str], str] | None = None) -> int:
    cluster = LocalCluster()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    engine_flags = engine_argv(args)
    model_index = engine_flags.index("--model")
    spec = ClusterSpec(num_prefill=args.num_prefill, num_decode=args.num_decode, transport=args.transport,
                       model=args.model, engine_argv=engine_flags[:model_index] + engine_flags[model_index + 2:],
                       router_argv=router_args, link_gbps=args.link_gbps, host=args.host, port=args.port,
                       log_level=args.log_level)
    try:
        await cluster.start(spec)
        host, port = cluster.router_address
        roles = ", ".join(f"{c.name} at {c.address[0]}:{c.address[1]}" for c in cluster.children[:-1])
        print(f"cluster ready ({args.transport} KV transport): {roles}", flush=True)
        print(f"router: {host}:{port}  (Python: await minipd.client.ClusterClient.connect({host!r}, {port}))",
              flush=True)
        for line in cluster.child("router").announcements:
            print(line, flush=True)
        if prompts:
            client = await ClusterClient.connect(host, port)
            try:
                return await answer_prompts(client, prompts, params, wrap=wrap)
            finally:
                await client.close()
        print("serving; Ctrl-C stops every process", flush=True)
        await stop.wait()
        return 0
    except RuntimeError as exc:
        print(f"minipd cluster: {exc}", file=sys.stderr)
        return 1
    finally:
        await cluster.stop()
