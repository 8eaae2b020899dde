"""Start llama.cpp's `llama-server` (or a binary taking its flags) as the peer of `bench.py peer`.

The peer gets what the minipd the bench starts gets: the same GGUF file, the same cores
(`taskset -c CPUS`) and the same number of threads (`-t`/`-tb`), so the two are compared on
equal hardware; the bench alternates between them, so they never run at once. `slots` parallel
sequences (`-np`), each with `ctx_per_slot` tokens of context (`-c` is split among the slots).
The server is ready when `GET /health` answers 200 (llama-server answers 503 while it loads).
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from benchmarks.loadgen.deployments import wait_healthy
from benchmarks.loadgen.processes import Processes

READY_TIMEOUT_S = 120.0
HOST = "127.0.0.1"


def model_file(model: str) -> Path:
    """The GGUF file behind minipd's `--model` value (a packaged name such as smollm2, or a path);
    ValueError when it names no GGUF file, since the peer must serve the very file minipd does."""
    path = Path(model)
    if path.suffix != ".gguf":
        from minipd.models.checkpoints.packaged_models import packaged_model_path

        try:
            path = packaged_model_path(model)
        except (KeyError, ValueError, FileNotFoundError) as exc:
            raise ValueError(f"--peer-binary: --model {model!r} is not a GGUF file the peer can serve ({exc})") from exc
    if not path.is_file():
        raise ValueError(f"--peer-binary: model file {path} does not exist")
    return path


def _free_port() -> int:
    with socket.socket() as probe:  # the peer binds it a moment later; a clash fails its start, loudly
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def peer_argv(binary: str, model: Path, port: int, cpus: str, threads: int, slots: int, ctx_per_slot: int) -> list[str]:
    """The command line: pinned with taskset, llama-server's own flags for threads, slots, context."""
    found = shutil.which(binary)
    if found is None:
        raise ValueError(f"--peer-binary: {binary!r} is not an executable file")
    taskset = shutil.which("taskset")
    pin = [taskset, "-c", cpus] if taskset else []
    return [
        *pin,
        found,
        "-m",
        str(model),
        "--host",
        HOST,
        "--port",
        str(port),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-np",
        str(slots),
        "-c",
        str(slots * ctx_per_slot),
    ]


def start_peer(
    processes: Processes, binary: str, model: Path, cpus: str, threads: int, slots: int, ctx_per_slot: int
) -> str:
    """Start the peer under `processes` (stopped with them); returns its base URL once healthy."""
    port = _free_port()
    child = processes.start("peer", peer_argv(binary, model, port, cpus, threads, slots, ctx_per_slot))
    child.drain()
    url = f"http://{HOST}:{port}"
    wait_healthy(url, child, READY_TIMEOUT_S)
    return url
