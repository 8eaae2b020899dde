"""What one streamed chat touches: the files and lines of minipd that run, in every process of a
local cluster, while one request goes through it after start-up.

    python bench.py footprint --json footprint.json --plot footprint.png

Starts `minipd --role cluster --num-prefill 1 --num-decode 1 --transport tcp --http-port 0`
(the defaults a user gets: dashboard, metrics, timelines) with a line recorder in each process
(benchmarks/footprint/hook/sitecustomize.py, loaded through PYTHONPATH), sends `--warmup`
streamed chats so that nothing of start-up or of a first request is counted, then records
while one more streamed chat (`--prompt-words` words: longer than the router's local-prefill
threshold, so its KV crosses from prefill to decode) is answered, and counts the package's
(minipd/, models/, transports/) files and lines that ran, per process and in all. Background
work that falls inside the window (heartbeats, the dashboard's pushes) is counted with it:
the window is kept to the request's own span, and `--repeats` windows give the median.

Figures: `files` (distinct files with a line run), `file_lines` (those files' lengths added:
what a reader opens), `lines_run` (distinct lines run), and each per package folder; the median
run's `by_file` gives each file's lines and how many of them ran (`[lines, run]`), its `lines`
the line numbers run, and the table names the largest files: where a reader opens much to
follow little.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK = Path(__file__).resolve().parent / "hook"
PACKAGE_FOLDERS = ("minipd", "models", "transports")
ANNOUNCE = "minipd: serving the OpenAI API for "
STARTUP_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 120.0
DUMP_TIMEOUT_S = 30.0
ROLES = ("router", "prefill", "decode")
TOP_FILES = 12  # the largest files the table names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny", help="model of the cluster (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens of the recorded chat (default: %(default)s)")
    parser.add_argument("--prompt-words", type=int, default=40, help="words of its prompt (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2, help="chats before recording (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="recorded chats (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="one warm-up chat and one recorded chat")


class _Cluster:
    """`minipd --role cluster` with the recorder in every process; its output drained by a thread."""

    def __init__(self, args: argparse.Namespace, record_dir: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOK), env.get("PYTHONPATH")]))
        env["MINIPD_FOOTPRINT_DIR"], env["MINIPD_FOOTPRINT_ROOT"] = record_dir, str(ROOT)
        argv = [sys.executable, "-m", "minipd", "--role", "cluster", "--num-prefill", "1", "--num-decode", "1"]
        argv += ["--transport", "tcp", "--http-port", "0", "--model", args.model]
        self.process = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        self.output: deque = deque(maxlen=200)
        self.url: str | None = None
        ready = threading.Event()

        def drain() -> None:
            for line in self.process.stdout:
                self.output.append(line.rstrip("\n"))
                if line.startswith(ANNOUNCE) and self.url is None:
                    self.url = line.rsplit(" on ", 1)[1].strip()
                    ready.set()
            ready.set()

        threading.Thread(target=drain, name="cluster-output", daemon=True).start()
        if not ready.wait(STARTUP_TIMEOUT_S) or self.url is None:
            self.stop()
            raise RuntimeError("the cluster did not announce its API; its last lines:\n" + "\n".join(self.output))

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


def _serving_pids(record_dir: Path) -> dict[int, str]:
    """The cluster's serving processes (router, prefill, decode; not the launcher) -> role."""
    pids = {}
    for path in record_dir.glob("*.pid"):
        argv = path.read_text().split()
        role = argv[argv.index("--role") + 1] if "--role" in argv else None
        if role in ROLES:
            pids[int(path.stem)] = role
    return pids


def _chat(url: str, args: argparse.Namespace, n: int) -> int:
    """Streamed chat `n` (its prompt begins with `n`: no prefix cache serves it); the number of
    streamed chunks."""
    words = " ".join(f"word{n}-{i}" for i in range(args.prompt_words))
    body = json.dumps(
        {
            "model": args.model,
            "messages": [{"role": "user", "content": f"{n}: count these: {words}"}],
            "max_tokens": args.max_tokens,
            "stream": True,
            "temperature": 0,
        }
    ).encode()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"}, method="POST"
    )
    chunks = 0
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        for line in response:
            if line.startswith(b"data: {"):
                chunks += 1
    if chunks == 0:
        raise RuntimeError("the chat streamed no chunk")
    return chunks


def _record_one(url: str, args: argparse.Namespace, record_dir: Path, pids: dict[int, str], n: int) -> dict:
    for pid in pids:
        (record_dir / f"{pid}.json").unlink(missing_ok=True)
        (record_dir / f"{pid}.recording").unlink(missing_ok=True)
        os.kill(pid, signal.SIGUSR1)
    _wait_for_files(record_dir, [f"{pid}.recording" for pid in pids], "started recording")
    started = time.perf_counter()
    chunks = _chat(url, args, n)
    elapsed = time.perf_counter() - started
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)
    _wait_for_files(record_dir, [f"{pid}.json" for pid in pids], "wrote its record")
    per_role = {}
    for pid, role in pids.items():
        lines = json.loads((record_dir / f"{pid}.json").read_text())["lines"]
        per_role[role] = {_relative(f): v for f, v in lines.items() if _relative(f) is not None}
    return {"chunks": chunks, "request_s": elapsed, "per_role": per_role}


def _wait_for_files(folder: Path, names: list[str], what: str) -> None:
    """Until every process of the cluster has written its file (its signal handler ran), at most
    DUMP_TIMEOUT_S; RuntimeError naming what did not happen."""
    deadline = time.monotonic() + DUMP_TIMEOUT_S
    while not all((folder / name).exists() for name in names):
        if time.monotonic() > deadline:
            raise RuntimeError(f"a process of the cluster never {what}")
        time.sleep(0.02)  # poll interval of a bounded wait for another process's file


def _relative(filename: str) -> str | None:
    try:
        relative = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    return str(relative) if relative.parts[0] in PACKAGE_FOLDERS else None


def _figures(files: dict[str, list[int]]) -> dict:
    lengths = {f: (ROOT / f).read_text().count("\n") for f in files}
    by_folder: Counter = Counter()
    for f in files:
        by_folder[f.split("/")[0] if not f.startswith("minipd/") else "/".join(f.split("/")[:2])] += lengths[f]
    return {
        "files": len(files),
        "file_lines": sum(lengths.values()),
        "lines_run": sum(len(v) for v in files.values()),
        "file_lines_by_folder": dict(sorted(by_folder.items())),
        "by_file": {f: [lengths[f], len(files[f])] for f in sorted(files, key=lambda f: -lengths[f])},
    }


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        args.warmup, args.repeats = 1, 1
    if args.repeats < 1 or args.warmup < 0:
        raise ValueError("--repeats must be at least 1 and --warmup at least 0")
    with tempfile.TemporaryDirectory(prefix="minipd-footprint-") as tmp:
        record_dir = Path(tmp)
        cluster = _Cluster(args, tmp)
        try:
            pids = _serving_pids(record_dir)
            if sorted(pids.values()) != sorted(ROLES):
                raise RuntimeError(f"expected a router, a prefill and a decode process; found {pids}")
            for n in range(args.warmup):
                _chat(cluster.url, args, n)
            windows = [_record_one(cluster.url, args, record_dir, pids, args.warmup + n) for n in range(args.repeats)]
        finally:
            cluster.stop()
    runs = []
    for window in windows:
        union: dict[str, set[int]] = {}
        for files in window["per_role"].values():
            for f, lines in files.items():
                union.setdefault(f, set()).update(lines)
        runs.append(
            {
                "all": _figures({f: sorted(v) for f, v in union.items()}),
                "per_role": {role: _figures(files) for role, files in window["per_role"].items()},
                "files": sorted(union),
                "lines": {f: sorted(v) for f, v in sorted(union.items())},  # the line numbers run, per file
                "request_s": window["request_s"],
                "chunks": window["chunks"],
            }
        )
    median = sorted(runs, key=lambda r: r["all"]["file_lines"])[len(runs) // 2]
    return {
        "model": args.model,
        "max_tokens": args.max_tokens,
        "prompt_words": args.prompt_words,
        "repeats": args.repeats,
        "files": median["all"]["files"],
        "file_lines": median["all"]["file_lines"],
        "lines_run": median["all"]["lines_run"],
        "file_lines_runs": [r["all"]["file_lines"] for r in runs],
        "files_runs": [r["all"]["files"] for r in runs],
        "median_run": median,
        "file_lines_median_spread": statistics.pstdev(r["all"]["file_lines"] for r in runs),
    }


def print_table(result: dict) -> None:
    median = result["median_run"]
    print(f"one streamed chat ({result['max_tokens']} tokens) through a 1P+1D cluster, {result['model']}; median of")
    print(f"{result['repeats']} recorded chats (file_lines per run: {result['file_lines_runs']})")
    print(f"  {'process':<10} {'files':>6} {'file lines':>11} {'lines run':>10}")
    for role in ROLES:
        f = median["per_role"][role]
        print(f"  {role:<10} {f['files']:>6} {f['file_lines']:>11} {f['lines_run']:>10}")
    print(f"  {'all':<10} {result['files']:>6} {result['file_lines']:>11} {result['lines_run']:>10}")
    print("  file lines by folder: " + ", ".join(f"{k} {v}" for k, v in median["all"]["file_lines_by_folder"].items()))
    print(f"  the {TOP_FILES} largest files run (lines, of them run):")
    for f, (lines, run) in list(median["all"]["by_file"].items())[:TOP_FILES]:
        print(f"    {f:<48} {lines:>5} {run:>5}")


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folders = result["median_run"]["all"]["file_lines_by_folder"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.barh(list(folders), list(folders.values()), color="#3465a4")
    ax.set_xlabel("lines of the files a streamed chat runs")
    ax.set_title(f"one streamed chat: {result['files']} files, {result['file_lines']} lines ({result['model']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
