"""A disaggregated cluster across a `ShapedLink`: the instances started by hand in the namespaces.

    ip netns exec P minipd --role prefill --host P_KV --port 0 --transport tcp ...
    ip netns exec D minipd --role decode  --host D_KV --port 0 --transport tcp ...
    minipd --role router --port 0 --prefill P_KV:PORT --decode D_KV:PORT --http-port 0 ...

Each instance prints `READY <role> <id> <host>:<port>` once it serves; the router then
announces its OpenAI API. Every process belongs to the caller's `Processes`, which must be
left before the `ShapedLink` (processes first, then the namespaces).
"""

from __future__ import annotations

from benchmarks.loadgen.deployments import READY_TIMEOUT_S, Deployment, ServerOptions, parse_announcement, wait_healthy
from benchmarks.loadgen.netns import ShapedLink
from benchmarks.loadgen.processes import Processes, minipd_command

READY_PREFIX = "READY "


def parse_ready(line: str) -> str | None:
    """The `host:port` of an instance's READY line."""
    return line.split()[-1] if line.startswith(READY_PREFIX) else None


def start_netns_cluster(
    processes: Processes, link: ShapedLink, options: ServerOptions, router_flags: tuple[str, ...] = ()
) -> Deployment:
    if options.transport != "tcp":
        raise ValueError(f"transport: the shaped namespace link carries the KV over tcp, not {options.transport!r}")
    command = minipd_command()
    children = []
    for role, namespace, address in (
        ("prefill", link.prefill_ns, link.prefill_address),
        ("decode", link.decode_ns, link.decode_address),
    ):
        argv = [
            *link.exec_in(namespace),
            *command,
            "--role",
            role,
            "--instance-id",
            f"{role}-0",
            "--host",
            address,
            "--port",
            "0",
            "--transport",
            "tcp",
            *options.engine_flags(),
        ]
        children.append(processes.start(role, argv))
    endpoints = []
    for child in children:  # both load their model at the same time
        endpoints.append(child.wait_for_line(parse_ready, READY_TIMEOUT_S))
        child.drain()
    prefill_at, decode_at = endpoints
    router = processes.start(
        "router",
        [
            *command,
            "--role",
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--model",
            options.model,
            "--prefill",
            prefill_at,
            "--decode",
            decode_at,
            "--http-port",
            "0",
            *router_flags,
        ],
    )
    url = router.wait_for_line(parse_announcement, READY_TIMEOUT_S)
    router.drain()
    wait_healthy(url, router)
    return Deployment(
        [url],
        "disaggregated",
        f"prefill in {link.prefill_ns}, decode in {link.decode_ns}, KV over a tc-shaped veth pair",
    )
