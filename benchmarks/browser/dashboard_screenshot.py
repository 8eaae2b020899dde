"""Take `docs/figures/dashboard.png`: the dashboard of a live cluster under load, in headless Chromium.

    python -m benchmarks.browser.dashboard_screenshot [--out docs/figures/dashboard.png] [--model tiny]
    python -m benchmarks.browser.dashboard_screenshot --element timelines-panel --out docs/figures/timelines.png

Starts `minipd --role cluster --http-port 0` (two prefill and two decode instances; CPU
placement as the launcher plans it), sends streamed completions from a few client threads for
`--load-s` seconds (mixed prompt lengths, so the KV links carry traffic and the SLO charts
fill), then opens the dashboard and saves the page once it shows every instance (or, with
`--element ID`, that element of it only). Every process it starts is stopped before it exits.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from pathlib import Path
from typing import NamedTuple

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from benchmarks.browser.chromium import close_browser, open_browser

ROOT = Path(__file__).resolve().parents[2]
ANNOUNCE = "minipd: dashboard on "
STARTUP_TIMEOUT_S = 120.0
OUTPUT_LINES = 200
SNAPSHOT_TIMEOUT_S = 10.0


class Cluster(NamedTuple):
    process: subprocess.Popen
    url: str  # the dashboard's
    output: deque  # the last lines the cluster printed (stdout and stderr), drained as it runs


def start_cluster(model: str, extra: list[str]) -> Cluster:
    """Start the cluster; returns once it announced its dashboard. Its output is read to the end
    by a thread (a pipe nobody drains would block the cluster once full); the last
    OUTPUT_LINES lines are kept for a failure's report."""
    argv = [sys.executable, "-m", "minipd", "--role", "cluster", "--http-port", "0", "--model", model, *extra]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    output: deque = deque(maxlen=OUTPUT_LINES)
    announced: dict[str, str] = {}
    ready = threading.Event()

    def drain() -> None:
        for line in process.stdout:
            output.append(line.rstrip("\n"))
            if line.startswith(ANNOUNCE) and not ready.is_set():
                announced["url"] = line[len(ANNOUNCE) :].strip()
                ready.set()
        ready.set()  # the cluster exited (or closed its output) without announcing

    threading.Thread(target=drain, name="cluster-output", daemon=True).start()
    if not ready.wait(STARTUP_TIMEOUT_S) or "url" not in announced:
        stop(process)
        tail = "\n".join(output)
        raise RuntimeError(f"the cluster did not announce its dashboard; its last lines:\n{tail}")
    return Cluster(process, announced["url"], output)


def fresh_snapshot(driver, after: float, timeout_s: float = SNAPSHOT_TIMEOUT_S) -> None:
    """Wait until the page has rendered a snapshot built after `after` (Unix seconds)."""
    WebDriverWait(driver, timeout_s).until(
        lambda d: (d.execute_script("return window.minipdLatest && window.minipdLatest.time") or 0) > after
    )


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


def load(base: str, model: str, until: float, worker: int) -> None:
    """Streamed completions until `until`: long and short prompts in turn."""
    i = 0
    while time.monotonic() < until:
        words = 5 if i % 2 == 0 else 1
        body = {
            "model": model,
            "prompt": f"client {worker} request {i}: " + "prefill and decode on their own pools " * words,
            "max_tokens": 24,
            "stream": True,
            "ignore_eos": True,
        }
        request = urllib.request.Request(
            f"{base}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            for _ in response:
                pass
        i += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "dashboard.png")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--load-s", type=float, default=25.0, help="seconds of load before the screenshot")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--element", help="the id of the one element to save (e.g. timelines-panel), not the page")
    args = parser.parse_args(argv)
    process, url, _ = start_cluster(args.model, ["--num-prefill", "2", "--num-decode", "2", "--dtype", "float32"])
    driver = None
    try:
        base = url.rsplit("/dashboard", 1)[0]
        until = time.monotonic() + args.load_s
        workers = [threading.Thread(target=load, args=(base, args.model, until, w)) for w in range(args.clients)]
        for w in workers:
            w.start()
        driver = open_browser()
        driver.get(url)
        WebDriverWait(driver, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".inst")) == 4)
        for w in workers:
            w.join()
        WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "verdict").get_attribute("data-verdict"))
        fresh_snapshot(driver, time.time())  # one more snapshot after the last request, so the figures are final
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.element:
            element = driver.find_element(By.ID, args.element)
            driver.execute_script("arguments[0].scrollIntoView()", element)
            element.screenshot(str(args.out))
        else:
            driver.save_screenshot(str(args.out))
        print(f"wrote {args.out}")
        return 0
    finally:
        if driver is not None:
            close_browser(driver)
        stop(process)


if __name__ == "__main__":
    sys.exit(main())
