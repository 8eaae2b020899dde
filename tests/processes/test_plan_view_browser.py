"""The dashboard's Plan view and its live prediction in a real browser (Debian's headless
Chromium, Selenium) against a live process cluster on `tiny` started with `--plan-profile`, a
profile measured here by `bench.py profile --model tiny --quick`:

- moving a Plan slider (keys on the rate slider, as a user moves it) redraws the bars: the
  green zone changes, and every bar agrees with what POST /dashboard/plan answers for the same
  inputs; the page says how many requests each run simulates and how long the answer took;
- after some load the Live view's prediction shows the simulator's figures next to the measured
  ones with their error, naming the profile it uses; a profile of another model (a built-in
  Llama one) gives no figures and says why;
- the browser console has no error.
Every test saves a screenshot on failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from http_helpers import start_cluster, stop
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select
from test_dashboard_browser import browser, cards, screenshot_on_failure, wait_for  # noqa: F401 (a fixture)

from benchmarks.browser.chromium import console_errors

BENCH = Path(__file__).resolve().parents[2] / "bench.py"
PROFILE_TIMEOUT_S = 300
REDRAW_S = 1.0  # what the page promises at 8 instances; asserted with room for this shared machine
REDRAW_BOUND_S = 10.0


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan-profile") / "tiny.json"
    subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "profile",
            "--model",
            "tiny",
            "--quick",
            "--torch-threads",
            "1",
            "--json",
            str(path),
        ],
        check=True,
        timeout=PROFILE_TIMEOUT_S,
        stdout=subprocess.DEVNULL,
    )
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, profile_path):
    server = start_cluster(
        tmp_path_factory.mktemp("plan-view"),
        "--model",
        "tiny",
        "--dtype",
        "float32",
        "--plan-profile",
        str(profile_path),
    )
    try:
        yield server
    finally:
        stop(server)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def bars(driver) -> list[dict]:
    return [
        {
            "label": g.get_attribute("data-label"),
            "green": g.get_attribute("data-green") == "true",
            "ttft_p90": g.get_attribute("data-ttft-p90"),
            "itl_p90": g.get_attribute("data-itl-p90"),
        }
        for g in driver.find_elements(By.CSS_SELECTOR, "#plan-bars g.plan-bar")
    ]


def drawn(driver) -> bool:
    return driver.find_element(By.ID, "plan-panel").get_attribute("data-state") == "drawn"


def drawn_for(driver) -> dict:
    """The inputs of the bars shown (the page draws an answer only for the inputs it asked with)."""
    return json.loads(driver.find_element(By.ID, "plan-panel").get_attribute("data-drawn-for") or "{}")


def test_moving_a_plan_slider_redraws_the_green_zone(cluster, browser, tmp_path):  # noqa: F811
    base = cluster.base_url
    with screenshot_on_failure(browser, tmp_path):
        browser.get(f"{base}/dashboard")
        wait_for(browser, lambda d: len(cards(d)) == 2, "the instances")
        browser.find_element(By.ID, "tab-plan").click()
        wait_for(browser, drawn, "the first plan")
        profiles = Select(browser.find_element(By.ID, "plan-profile"))
        assert profiles.first_selected_option.get_attribute("value") == "flag"  # the --plan-profile one first
        assert "tiny-float32-cpu" in profiles.first_selected_option.text
        profiles.select_by_value("llama3-8b-h100")
        wait_for(browser, lambda d: drawn(d) and "llama3-8b-h100" in d.find_element(By.ID, "plan-note").text, "Llama")
        before = bars(browser)
        assert [b["label"] for b in before] == ["colocated x8"] + [f"{p}P:{8 - p}D" for p in range(1, 8)]

        rate = browser.find_element(By.ID, "plan-rate")
        rate.send_keys(Keys.ARROW_RIGHT * 40)  # 60 -> 100 requests/s, as a user moves it
        moved_at = time.monotonic()
        wait_for(browser, lambda d: d.find_element(By.ID, "plan-rate-out").text == "100", "the slider at 100")
        wait_for(
            browser, lambda d: drawn(d) and drawn_for(d)["rate_rps"] == 100, "the bars of 100 req/s", REDRAW_BOUND_S
        )
        redraw_s = time.monotonic() - moved_at
        after = bars(browser)
        assert [b["green"] for b in after] != [b["green"] for b in before]  # the green zone moved
        assert sum(b["green"] for b in after) < sum(b["green"] for b in before)  # more load: fewer splits hold

        body = drawn_for(browser)
        assert body == browser.execute_script("return planBody()")  # nothing moved since
        assert body["rate_rps"] == 100 and body["profile"] == "llama3-8b-h100"
        answer = post(f"{base}/dashboard/plan", body)
        assert [(b["label"], b["green"]) for b in answer["bars"]] == [(b["label"], b["green"]) for b in after]
        for mine, shown in zip(answer["bars"], after):  # the bars drawn are the endpoint's figures
            for kind in ("ttft", "itl"):
                value = mine[kind]["p90"]
                assert shown[f"{kind}_p90"] == "null" if value is None else float(shown[f"{kind}_p90"]) == value
        assert answer["green_zone"] == [b["label"] for b in after if b["green"]]
        assert browser.find_element(By.ID, "plan-split-label").text == "· 6P:2D"
        assert browser.find_element(By.ID, "plan-verdict").get_attribute("data-verdict") == answer["verdict"]
        link = browser.find_element(By.ID, "plan-link-text")
        wait_for(browser, lambda d: link.get_attribute("data-state") == "found", "where the link breaks TTFT")
        assert "becomes the bottleneck of 6P:2D below" in link.text
        assert float(link.get_attribute("data-breaks-below")) == answer["link"]["breaks_below_gbps"]
        note = browser.find_element(By.ID, "plan-note").text
        assert "one simulated run of 150 requests" in note and " ms in the plan worker" in note
        assert "the link point (a bisection of 8 runs of 6P:2D)" in note
        print(f"bars redrawn {redraw_s:.2f} s after the slider moved ({note})")
        assert console_errors(browser) == []


def test_the_prediction_shows_figures_next_to_the_measured_ones(cluster, browser, tmp_path):  # noqa: F811
    base = cluster.base_url
    with screenshot_on_failure(browser, tmp_path):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=60)
        for i in range(8):
            client.completions.create(
                model="tiny", prompt=f"predicted {i}: " + "prefill then decode " * 5, max_tokens=8
            )
        browser.get(f"{base}/dashboard")
        panel = browser.find_element(By.ID, "prediction-panel")
        wait_for(browser, lambda d: panel.get_attribute("data-state") == "ok", "a prediction")
        assert "tiny-float32-cpu" in browser.find_element(By.ID, "prediction-profile").text
        assert "--plan-profile" in browser.find_element(By.ID, "prediction-profile").text
        assert "1P:1D at the measured" in browser.find_element(By.ID, "prediction-state").text
        for row in ("ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "itl_p90", "itl_p99"):
            tr = browser.find_element(By.CSS_SELECTOR, f'#prediction-table tr[data-row="{row}"]')
            measured, predicted, error = (
                tr.find_element(By.CSS_SELECTOR, f"td.{c}").text for c in ("measured", "predicted", "error")
            )
            assert measured.endswith(" ms") and predicted.endswith(" ms") and error.endswith("%)"), (
                row,
                measured,
                predicted,
                error,
            )
        share = browser.find_element(By.CSS_SELECTOR, '#prediction-table tr[data-row="ttft_share"] td.predicted').text
        assert share.endswith("%")
        answer = post(f"{base}/dashboard/prediction", {})
        assert answer["state"] == "ok" and answer["predicted"]["split"] == "1P:1D"
        assert answer["measured"]["requests"] >= 8 and answer["measured"]["rate_rps"] > 0

        # a profile of another model: no figures, and the page says why
        browser.find_element(By.ID, "tab-plan").click()
        wait_for(browser, drawn, "the plan")
        Select(browser.find_element(By.ID, "plan-profile")).select_by_value("llama3-8b-h100")
        browser.find_element(By.ID, "tab-live").click()
        wait_for(browser, lambda d: panel.get_attribute("data-state") == "no fit", "the refusal of a Llama profile")
        assert (
            "the profile is of Llama-3-8B, the cluster serves tiny"
            in browser.find_element(By.ID, "prediction-state").text
        )
        assert browser.find_elements(By.CSS_SELECTOR, "#prediction-table td.predicted") == []
        assert console_errors(browser) == []
