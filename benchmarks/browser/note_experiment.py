"""The design note's experiment, run from the dashboard page: mixed breaks ITL, the split holds,
a starved link breaks TTFT.

    python -m benchmarks.browser.note_experiment --json docs/results/note_experiment.json \\
        --plot docs/figures/note_experiment.png --screenshots docs/figures

Starts `minipd --role cluster --num-prefill 1 --num-decode 1 --http-port 0` on `--model`, opens
its dashboard in Debian's headless Chromium and, like a reader of the note, uses only the page:
it sets the SLOs in the SLO panel, then for each move fills the Controls panel's forms and
clicks (no API call of its own):
1. **mixed**: flip the cluster to colocated (both instances `both`), start the built-in
   prompt-heavy load;
2. **split**: flip back to a 1P:1D split, the same load;
3. **starved**: cap the prefill instance's KV link at `--starve-gbps`, the same load (the cap
   is lifted afterwards).
Each move waits for the load run to end, then one more snapshot, and reads what the page shows:
the headline's P90 TTFT and ITL over the page's sliding window, the verdict, the attainment,
the KV per request, and the load run's own P90s from the Controls panel (that run's requests
only). It saves a screenshot per move, writes the figures as JSON, a table and a bar plot of
the run's P90s against the SLO lines. Every process it starts is stopped before it exits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from benchmarks.browser.chromium import close_browser, console_errors, open_browser, type_into
from benchmarks.browser.dashboard_screenshot import SNAPSHOT_TIMEOUT_S, fresh_snapshot, start_cluster, stop

MOVES = ("mixed", "split", "starved")
FLIP_TIMEOUT_S = 120.0
LOAD_START_TIMEOUT_S = 30.0
LOAD_CLICK_WAIT_S = 5.0  # a start's answer, on a busy 2-core machine
LOAD_START_CLICKS = 3


def set_value(driver, element_id: str, value) -> None:
    box = driver.find_element(By.ID, element_id)
    type_into(box, str(value))


def set_slo(driver, ttft_ms: float, itl_ms: float) -> None:
    set_value(driver, "slo-ttft", ttft_ms)
    set_value(driver, "slo-itl", itl_ms)
    driver.find_element(By.ID, "slo-set").click()
    WebDriverWait(driver, SNAPSHOT_TIMEOUT_S).until(lambda d: d.find_element(By.ID, "message").text == "SLO set")


def flip(driver, mode: str, num_prefill: int = 1) -> str:
    """Flip the cluster from the Controls panel; the page's answer ("1P:1D + 0 colocated, ...")."""
    driver.find_element(By.ID, "flip-colocated" if mode == "colocated" else "flip-split").click()
    if mode != "colocated":
        set_value(driver, "flip-prefill", num_prefill)
    driver.find_element(By.ID, "flip-apply").click()

    def answered(d):
        error = d.find_element(By.ID, "flip-error").text
        if error:
            raise RuntimeError(f"the flip to {mode} was refused: {error}")
        text = d.find_element(By.ID, "flip-result").text
        return text if text and "switching" not in text else False

    return WebDriverWait(driver, FLIP_TIMEOUT_S).until(answered)


def set_link_cap(driver, gbps: float | None) -> str:
    """Cap (or, with None, lift) every prefill instance's KV link from its row in the panel."""
    rows = driver.find_elements(By.CSS_SELECTOR, "#link-cap-rows .cap-row")
    if not rows:
        raise RuntimeError("the page lists no prefill instance to cap")
    for row in rows:
        if gbps is None:
            row.find_element(By.CSS_SELECTOR, ".cap-lift").click()
        else:
            box = row.find_element(By.CSS_SELECTOR, ".cap-gbps")
            type_into(box, str(gbps))
            row.find_element(By.CSS_SELECTOR, ".cap-set").click()
        want = "uncapped" if gbps is None else "capped at"
        WebDriverWait(driver, SNAPSHOT_TIMEOUT_S).until(
            lambda d, row=row, want=want: want in row.find_element(By.CSS_SELECTOR, ".cap-state").text
        )
    return rows[0].find_element(By.CSS_SELECTOR, ".cap-state").text


def page_load_state(driver) -> dict:
    """What the Controls panel's load form shows, for a report of why a start was not seen."""
    return driver.execute_script(
        """const p = document.getElementById("load-progress"), form = document.getElementById("load-form");
        return {button_disabled: document.getElementById("load-start").disabled, form_valid: form.checkValidity(),
                error: document.getElementById("load-error").textContent, run: p.dataset.run || "",
                state: p.dataset.state || "", progress: p.textContent,
                values: ["load-value", "load-count", "load-duration"].map((i) => document.getElementById(i).value)};"""
    )


def run_load(driver, args, base: str) -> str:
    """Start the built-in load from the panel and wait for it to end; the panel's last line.

    A click can reach no button: on a busy machine the page re-renders the panels above the
    form between WebDriver scrolling to the button and the click landing, and the click hits
    whatever moved under it. The page then sent nothing, the button never turned disabled
    (it is, while a start is under way) and the server's last run is unchanged: only then is
    the button clicked again, so no run is started twice."""
    Select(driver.find_element(By.ID, "load-workload")).select_by_visible_text(args.workload)
    Select(driver.find_element(By.ID, "load-arrivals")).select_by_value("rate")
    set_value(driver, "load-value", args.rate)
    set_value(driver, "load-count", args.num_requests)
    set_value(driver, "load-duration", args.duration_s)
    progress = driver.find_element(By.ID, "load-progress")
    before = progress.get_attribute("data-run") or ""
    server_before = admin_load(base).get("run")

    def started(d):
        error = d.find_element(By.ID, "load-error").text
        if error:
            raise RuntimeError(f"the page's load start was refused: {error}")
        return (progress.get_attribute("data-run") or "") not in ("", before)

    # the page shows the new run's tag from the start call's answer on: a run that failed (or
    # ended) before this wait first looked is seen too, where waiting for "running" could miss it
    deadline = time.monotonic() + LOAD_START_TIMEOUT_S
    for attempt in range(1, LOAD_START_CLICKS + 1):
        driver.find_element(By.ID, "load-start").click()
        try:
            WebDriverWait(driver, LOAD_CLICK_WAIT_S).until(started)
            break
        except TimeoutException:
            pass
        page, server = page_load_state(driver), admin_load(base)
        if page["button_disabled"] or server.get("run") != server_before:
            # the start reached the server (or is on its way): the page will show its answer
            remaining = max(1.0, deadline - time.monotonic())
            try:
                WebDriverWait(driver, remaining).until(started)
                break
            except TimeoutException:
                page, server = page_load_state(driver), admin_load(base)
                raise RuntimeError(
                    f"the page shows no new load run {LOAD_START_TIMEOUT_S:g} s after its start: page {page}, "
                    f"server {server.get('run')!r} {server.get('state')!r}"
                ) from None
        print(f"the start click (attempt {attempt}) made no request (page {page}): clicked again", file=sys.stderr)
    else:
        raise RuntimeError(
            f"{LOAD_START_CLICKS} clicks on the page's start button made no request: page {page_load_state(driver)}"
        )
    # the run is bounded by its duration; its in-flight requests are aborted at the end
    WebDriverWait(driver, args.duration_s + 120).until(
        lambda d: progress.get_attribute("data-state") in ("finished", "stopped", "failed")
    )
    if progress.get_attribute("data-state") == "failed":
        raise RuntimeError(f"the load run failed: {progress.text}")
    return progress.text


def read_page(driver) -> dict:
    text = {
        i: driver.find_element(By.ID, i).text for i in ("h-ttft", "h-itl", "verdict", "h-attain", "h-kv", "h-kv-sub")
    }
    return {"page": text, "verdict": driver.find_element(By.ID, "verdict").get_attribute("data-verdict")}


def admin_load(base: str) -> dict:
    with urllib.request.urlopen(f"{base}/admin/load", timeout=10) as response:
        return json.load(response)


def run_move(driver, base: str, move: str, args, shots: Path | None) -> dict:
    if move == "mixed":
        setting = flip(driver, "colocated")
    elif move == "split":
        setting = flip(driver, "split", 1)
    else:
        setting = set_link_cap(driver, args.starve_gbps)
    panel = run_load(driver, args, base)
    fresh_snapshot(driver, time.time())
    load = admin_load(base)
    result = {
        "move": move,
        "setting": setting,
        "load_panel": panel,
        "run_p90_ttft_ms": _ms(load["ttft_s"]["p90"]),
        "run_p90_itl_ms": _ms(load["itl_s"]["p90"]),
        "completed": load["completed"],
        "failed": load["failed"],
        **read_page(driver),
    }
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shots / f"note_{move}.png"))
    return result


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


def print_table(results: list[dict], args) -> None:
    print(f"{args.workload} at {args.rate} req/s, SLO TTFT {args.ttft_ms:g} ms / ITL {args.itl_ms:g} ms")
    print(
        f"{'move':<8} {'run P90 TTFT':>13} {'run P90 ITL':>12} {'page TTFT':>10} {'page ITL':>9}  verdict  KV/request"
    )
    for r in results:
        page = r["page"]
        print(
            f"{r['move']:<8} {r['run_p90_ttft_ms']!s:>13} {r['run_p90_itl_ms']!s:>12} "
            f"{page['h-ttft']:>10} {page['h-itl']:>9}  {r['verdict']:<8} {page['h-kv']}"
        )


def plot(results: list[dict], args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    names = [r["move"] for r in results]
    for ax, key, slo, title in (
        (axes[0], "run_p90_ttft_ms", args.ttft_ms, "P90 TTFT (ms)"),
        (axes[1], "run_p90_itl_ms", args.itl_ms, "P90 ITL (ms)"),
    ):
        values = [r[key] or 0.0 for r in results]
        colours = ["#2e7d32" if v <= slo else "#c62828" for v in values]
        ax.bar(names, values, color=colours)
        ax.axhline(slo, color="black", linestyle="--", linewidth=1, label=f"SLO {slo:g} ms")
        ax.set_title(title)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"the note's experiment from the dashboard: {args.workload} at {args.rate} req/s, {args.model}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--workload", default="prefill-heavy")
    parser.add_argument("--rate", type=float, default=1.3, help="requests per second (Poisson)")
    parser.add_argument("--num-requests", type=int, default=90)
    parser.add_argument("--duration-s", type=float, default=70.0, help="each move's load run (the window is 60 s)")
    parser.add_argument("--ttft-ms", type=float, default=5000.0)
    parser.add_argument("--itl-ms", type=float, default=150.0)
    parser.add_argument("--starve-gbps", type=float, default=0.1, help="the prefill KV link cap of the third move")
    parser.add_argument("--moves", nargs="+", choices=MOVES, default=list(MOVES))
    parser.add_argument("--cluster-args", default="", help="extra flags for minipd --role cluster")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--screenshots", type=Path, help="folder for note_<move>.png")
    args = parser.parse_args(argv)
    extra = ["--num-prefill", "1", "--num-decode", "1", *args.cluster_args.split()]
    process, url, output = start_cluster(args.model, extra)
    driver = None
    try:
        base = url.rsplit("/dashboard", 1)[0]
        driver = open_browser()
        driver.get(url)
        WebDriverWait(driver, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".inst")) == 2)
        set_slo(driver, args.ttft_ms, args.itl_ms)
        results = [run_move(driver, base, move, args, args.screenshots) for move in args.moves]
        if "starved" in args.moves:
            set_link_cap(driver, None)
        errors = console_errors(driver)
        print_table(results, args)
        if errors:
            print("browser console errors:", *errors, sep="\n  ")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            doc = {
                "model": args.model,
                "workload": args.workload,
                "rate": args.rate,
                "num_requests": args.num_requests,
                "duration_s": args.duration_s,
                "slo_ms": {"ttft": args.ttft_ms, "itl": args.itl_ms},
                "starve_gbps": args.starve_gbps,
                "moves": results,
                "console_errors": errors,
            }
            args.json.write_text(json.dumps(doc, indent=2) + "\n")
        if args.plot:
            plot(results, args, args.plot)
        return 1 if errors else 0
    except Exception:
        print("the cluster's last lines:", *output, sep="\n  ", file=sys.stderr)
        raise
    finally:
        if driver is not None:
            close_browser(driver)
        stop(process)


if __name__ == "__main__":
    sys.exit(main())
