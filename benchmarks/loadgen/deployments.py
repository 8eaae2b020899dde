"""Start minipd deployments through the `minipd` command line, or point at running servers.

- colocated: `N` instances doing both phases (chunked prefill). Behind the router when the
  launcher has `--num-colocated` (`minipd --role cluster --num-colocated N --num-prefill 0
  --num-decode 0`); with an older launcher, `N` separate `minipd --role both` servers that
  the client takes in turn (`launch` in the description says which was used);
- disaggregated: `minipd --role cluster --num-prefill P --num-decode D` (router, KV over the
  chosen transport, optionally capped by `--link-gbps`);
- external: URLs given with `--url`; nothing is started or stopped.
Every process started belongs to the caller's `Processes` and stops with it.
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.error
import urllib.request
from typing import NamedTuple

import msgspec

from benchmarks.loadgen.processes import ManagedProcess, Processes, minipd_command

READY_TIMEOUT_S = 180.0  # several processes importing torch at once on a small machine
HEALTH_POLL_S = 0.2
HEALTH_TIMEOUT_S = 5.0
ANNOUNCE = re.compile(r"^minipd: serving the OpenAI API .* on (http://\S+)$")
NUM_COLOCATED_FLAG = "--num-colocated"


class ServerOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Flags every started instance gets; `extra_flags` are passed on as they are."""

    model: str = "small"
    torch_threads: int = 1
    max_model_len: int = 2048
    num_blocks: int | None = None  # None: minipd's default
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    transport: str = "tcp"
    extra_flags: tuple[str, ...] = ()

    def engine_flags(self) -> list[str]:
        flags = [
            "--model",
            self.model,
            "--torch-threads",
            str(self.torch_threads),
            "--max-model-len",
            str(self.max_model_len),
        ]
        optional = (
            ("--num-blocks", self.num_blocks),
            ("--max-num-batched-tokens", self.max_num_batched_tokens),
            ("--max-num-seqs", self.max_num_seqs),
        )
        for flag, value in optional:
            if value is not None:
                flags += [flag, str(value)]
        return flags + list(self.extra_flags)


class Deployment(NamedTuple):
    urls: list[str]  # OpenAI API base URLs; the client takes them in turn
    mode: str  # "colocated", "disaggregated" or "external"
    launch: str  # how it was started (the command line, in short)


def parse_announcement(line: str) -> str | None:
    match = ANNOUNCE.match(line)
    return match.group(1) if match else None


def wait_healthy(url: str, child: ManagedProcess | None, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll `url`/health until it answers 200; RuntimeError if the child exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if child is not None and child.process.poll() is not None:
            raise RuntimeError(f"{child.name} exited with status {child.process.returncode}:\n{child.log_tail()}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=HEALTH_TIMEOUT_S) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening yet, or 503 while instances connect
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}/health not ready within {timeout_s:g} s")
        time.sleep(HEALTH_POLL_S)  # polling a server that is still starting


def start_server(processes: Processes, name: str, argv: list[str]) -> str:
    """Start one minipd process that announces an OpenAI API; returns its URL once healthy."""
    child = processes.start(name, argv)
    url = child.wait_for_line(parse_announcement, READY_TIMEOUT_S)
    child.drain()
    wait_healthy(url, child)
    return url


_launcher_flags: dict[tuple[str, ...], str] = {}


def launcher_supports(flag: str) -> bool:
    """Whether `minipd --role cluster` has `flag` (asked once, from its --help)."""
    command = tuple(minipd_command())
    if command not in _launcher_flags:
        _launcher_flags[command] = subprocess.run(
            [*command, "--role", "cluster", "--help"], capture_output=True, text=True, timeout=READY_TIMEOUT_S
        ).stdout
    return flag in _launcher_flags[command]


def start_colocated(
    processes: Processes, options: ServerOptions, num_instances: int, launch: str = "auto"
) -> Deployment:
    """`launch`: "router" (needs `--num-colocated`), "separate", or "auto" (router when possible)."""
    if launch == "auto":
        launch = "router" if launcher_supports(NUM_COLOCATED_FLAG) else "separate"
    if launch == "router":
        argv = [
            *minipd_command(),
            "--role",
            "cluster",
            NUM_COLOCATED_FLAG,
            str(num_instances),
            "--num-prefill",
            "0",
            "--num-decode",
            "0",
            "--http-port",
            "0",
            "--transport",
            options.transport,
            *options.engine_flags(),
        ]
        return Deployment(
            [start_server(processes, "colocated-cluster", argv)],
            "colocated",
            f"minipd --role cluster {NUM_COLOCATED_FLAG} {num_instances}",
        )
    if launch != "separate":
        raise ValueError(f"colocated launch: {launch!r} is not one of auto, router, separate")
    urls = [
        start_server(
            processes, f"colocated-{i}", [*minipd_command(), "--role", "both", "--port", "0", *options.engine_flags()]
        )
        for i in range(num_instances)
    ]
    return Deployment(urls, "colocated", f"{num_instances} x minipd --role both (client round robin)")


def start_disaggregated(
    processes: Processes,
    options: ServerOptions,
    num_prefill: int = 1,
    num_decode: int = 1,
    link_gbps: float | None = None,
    router_flags: tuple[str, ...] = (),
) -> Deployment:
    argv = [
        *minipd_command(),
        "--role",
        "cluster",
        "--num-prefill",
        str(num_prefill),
        "--num-decode",
        str(num_decode),
        "--http-port",
        "0",
        "--transport",
        options.transport,
        *options.engine_flags(),
        *router_flags,
    ]
    if link_gbps is not None:
        argv += ["--link-gbps", f"{link_gbps:g}"]
    launch = f"minipd --role cluster --num-prefill {num_prefill} --num-decode {num_decode}"
    if link_gbps is not None:
        launch += f" --link-gbps {link_gbps:g}"
    return Deployment([start_server(processes, "disaggregated-cluster", argv)], "disaggregated", launch)


def external(urls: list[str]) -> Deployment:
    return Deployment([u.rstrip("/") for u in urls], "external", "given with --url")
