"""neighbour: a colocated instance's decode ITL with and without a CPU-burning neighbour process.

For each mode a `minipd --role both` process is started and answers prompts read from its
standard input, one at a time (each `--output-len` tokens, EOS ignored, greedy); it reports
each request's per-token ITL, of which the median counts. Requests alternate between quiet
and noisy (a neighbour process spinning a pure-Python loop, one core's worth of work, placed
by the OS scheduler unless `--neighbour-cpu` pins it), and which of the two comes first
alternates with every repeat, so drift on a shared machine hits both alike.

Modes:
- placement: minipd's defaults (one torch thread per core but one, passive OpenMP waiting);
- pinned: the same, with the whole instance pinned to the last core (`--cpus`);
- torch-default: `--no-cpu-placement` (torch's threads on every core, spinning OpenMP).

`ratio` is the noisy median ITL over the quiet median ITL; the target is <= 1.5 with placement.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time

from benchmarks.loadgen.baseline_plots import plot_neighbour as plot  # noqa: F401 (bench.py --plot)

MODES = {
    "placement": [],
    "pinned": ["--cpus", str(max(os.sched_getaffinity(0)))],
    "torch-default": ["--no-cpu-placement"],
}
TARGET_RATIO = 1.5
START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 120.0
NEIGHBOUR_WARM_CPU_S = 0.05  # the neighbour counts once it has burnt this much CPU time
NEIGHBOUR_START_TIMEOUT_S = 10.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ITL_LINE = re.compile(r"TTFT ([\d.]+) ms, ITL mean ([\d.]+) ms, p50 ([\d.]+) ms")
PROMPT = "The quick brown fox jumps over the lazy dog; the decoder keeps going for a while after it."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny", help="model of the instance (default: %(default)s)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=["placement", "torch-default"])
    parser.add_argument("--output-len", type=int, default=64, help="tokens per request (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=7, help="quiet/noisy pairs per mode (default: %(default)s)")
    parser.add_argument(
        "--neighbour-cpu",
        type=int,
        default=None,
        help="pin the neighbour to this core (default: wherever the OS puts it)",
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (3 pairs of 16 tokens)")


class Instance:
    """A `minipd --role both` process answering one stdin prompt at a time."""

    def __init__(self, model: str, output_len: int, extra: list[str]):
        argv = [
            sys.executable,
            "-m",
            "minipd",
            "--role",
            "both",
            "--model",
            model,
            "--max-tokens",
            str(output_len),
            "--ignore-eos",
            "--max-model-len",
            "512",
            "--num-blocks",
            "64",
            *extra,
        ]
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}  # each mode sets its own
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1, env=env
        )
        self._stdout, self._stderr = _lines(self.process.stdout), _lines(self.process.stderr)
        self.placement = self._read_placement()

    def _read_placement(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            line = _next_line(self._stderr, deadline, "the instance's start-up")
            if ": placement: " in line:
                return line.split(": placement: ", 1)[1].strip()

    def itl_ms(self) -> tuple[float, float]:
        """One request: (TTFT, median ITL) in ms, as the instance measured them."""
        self.process.stdin.write(PROMPT + "\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while True:
            match = ITL_LINE.search(_next_line(self._stdout, deadline, "a request"))
            if match:
                return float(match.group(1)), float(match.group(3))

    def close(self) -> None:
        self.process.stdin.close()  # end of input: the instance exits
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _lines(stream) -> queue.Queue:
    """Every line of `stream`, then None at its end, read by a daemon thread."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _next_line(lines: queue.Queue, deadline: float, what: str) -> str:
    try:
        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        raise RuntimeError(f"timed out waiting for {what}") from None
    if line is None:
        raise RuntimeError(f"the instance exited during {what}")
    return line


class Neighbour:
    """A process burning one core, started and stopped around the noisy requests."""

    def __init__(self, cpu: int | None):
        pin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\n" if cpu is not None else ""
        # Its own session, so it competes as another job on the host would: with the kernel's
        # autogroup scheduling a child of this process would only share this session's CPU time.
        self.process = subprocess.Popen([sys.executable, "-c", pin + "while True:\n    pass"], start_new_session=True)
        deadline = time.monotonic() + NEIGHBOUR_START_TIMEOUT_S
        while _cpu_seconds(self.process.pid) < NEIGHBOUR_WARM_CPU_S:  # started and spinning
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError("the neighbour process did not start burning CPU")
            time.sleep(0.01)  # polling its CPU time, which grows once it runs

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def _measure(mode: str, args: argparse.Namespace) -> dict:
    instance = Instance(args.model, args.output_len, MODES[mode])
    quiet, noisy, quiet_ttft, noisy_ttft = [], [], [], []
    try:
        instance.itl_ms()  # warm-up
        for r in range(args.repeats):
            for burning in (False, True) if r % 2 == 0 else (True, False):
                if burning:
                    neighbour = Neighbour(args.neighbour_cpu)
                    try:
                        ttft, itl = instance.itl_ms()
                    finally:
                        neighbour.stop()
                    noisy.append(itl)
                    noisy_ttft.append(ttft)
                else:
                    ttft, itl = instance.itl_ms()
                    quiet.append(itl)
                    quiet_ttft.append(ttft)
    finally:
        instance.close()
    q, n = statistics.median(quiet), statistics.median(noisy)
    return {
        "placement": instance.placement,
        "quiet_itl_ms": q,
        "noisy_itl_ms": n,
        "ratio": n / q,
        "quiet_ttft_ms": statistics.median(quiet_ttft),
        "noisy_ttft_ms": statistics.median(noisy_ttft),
        "quiet_itl_ms_runs": quiet,
        "noisy_itl_ms_runs": noisy,
    }


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        args.repeats, args.output_len = 3, 16
    result = {
        "model": args.model,
        "output_len": args.output_len,
        "repeats": args.repeats,
        "neighbour_cpu": args.neighbour_cpu,
        "cpus": len(os.sched_getaffinity(0)),
        "target_ratio": TARGET_RATIO,
        "modes": {},
    }
    load_before = os.getloadavg()[0]
    for mode in args.modes:
        result["modes"][mode] = _measure(mode, args)
    # Other jobs on the machine count as neighbours too: the 1-minute load average, before and after.
    result["load_average"] = [load_before, os.getloadavg()[0]]
    if "placement" in result["modes"]:
        result["ratio"] = result["modes"]["placement"]["ratio"]
    return result


def print_table(result: dict) -> None:
    where = "unpinned" if result["neighbour_cpu"] is None else f"pinned to CPU {result['neighbour_cpu']}"
    print(
        f"colocated decode ITL with a CPU-burning neighbour ({where}), model={result['model']}, "
        f"{result['output_len']} tokens per request, median of {result['repeats']} per column, "
        f"{result['cpus']} CPUs, load average {result['load_average'][0]:.1f} -> {result['load_average'][1]:.1f}"
    )
    print(f"{'mode':>14} {'quiet ITL':>10} {'noisy ITL':>10} {'ratio':>6}  placement")
    for mode, m in result["modes"].items():
        print(
            f"{mode:>14} {m['quiet_itl_ms']:>8.2f}ms {m['noisy_itl_ms']:>8.2f}ms {m['ratio']:>6.2f}  {m['placement']}"
        )
    if "ratio" in result:
        print(f"ratio with placement: {result['ratio']:.2f}  (target <= {result['target_ratio']})")
