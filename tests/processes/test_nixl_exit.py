"""A process that used NIXL ends with the exit status it chose, not a crash at exit.

NIXL's bundled UCX loads its InfiniBand modules, and with them a libnl-route whose
destructors segfault after Python has finalized (rc 139 after a clean shutdown) on a host with
no RDMA device. `transports/nixl.py` keeps those modules out there. These tests run what a
user runs: a process that makes an agent and exits, and a `--transport nixl` cluster whose
instances get SIGTERM after serving a request whose KV crossed over NIXL."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys

import pytest
from disagg_helpers import ENGINE_ARGV, ROUTER_ARGV

from minipd.engine.sampling_params import SamplingParams
from minipd.entrypoints.process_cluster import ProcessCluster

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("nixl_cu12") is None, reason="NIXL needs the nixl extra: pip install -e '.[nixl]'"
)

EXIT_BOUND_S = 60.0
AGENT_SCRIPT = """
import asyncio, sys, torch
from minipd.transports.backends import create_transport
pool = torch.zeros((2, 8, 2, 16, 2, 32), dtype=torch.float32)
transport = create_transport("nixl", pool, instance_id="exit-check")
asyncio.run(transport.start())
asyncio.run(transport.close())
print("agent made and closed", flush=True)
sys.exit(int(sys.argv[1]))
"""


def _without_ucx_modules() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("UCX_MODULES", None)  # what a user's shell has: the transport decides
    return env


@pytest.mark.parametrize("status", [0, 3])
def test_a_process_that_made_a_nixl_agent_exits_with_its_own_status(status):
    done = subprocess.run(
        [sys.executable, "-c", AGENT_SCRIPT, str(status)],
        env=_without_ucx_modules(),
        capture_output=True,
        text=True,
        timeout=EXIT_BOUND_S,
    )
    assert "agent made and closed" in done.stdout, done.stderr[-2000:]
    assert done.returncode == status, (done.returncode, done.stderr[-2000:])


def test_nixl_instances_exit_zero_on_sigterm_after_serving(loop_thread, monkeypatch):
    monkeypatch.delenv("UCX_MODULES", raising=False)  # the instances decide, as under a user's shell
    cluster = ProcessCluster.from_argv(
        ["--transport", "nixl", "--num-prefill", "1", "--num-decode", "1", *ENGINE_ARGV, *ROUTER_ARGV]
    )
    loop_thread.run(cluster.start(), timeout=180)

    async def scenario():
        client = await cluster.client()
        try:
            params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
            outputs = [o async for o in client.submit(list(range(100)), params)]  # > local prefill: KV over NIXL
        finally:
            await client.close()
        for name in ("prefill-0", "decode-0"):
            cluster.child(name).process.send_signal(signal.SIGTERM)
        codes = await asyncio.wait_for(
            asyncio.gather(*(cluster.child(n).process.wait() for n in ("prefill-0", "decode-0"))), EXIT_BOUND_S
        )
        return outputs, codes

    try:
        outputs, codes = loop_thread.run(scenario(), timeout=3 * EXIT_BOUND_S)
    finally:
        loop_thread.run(cluster.stop(), timeout=60)
    assert outputs[-1].error is None and outputs[-1].num_output_tokens == 4, outputs[-1]
    assert codes == [0, 0]
