"""The dashboard's request timelines in a real browser: Debian's headless Chromium, driven by
Selenium, against a live process cluster on `tiny` (router, one prefill and one decode process).

After known requests (two prefilled on the prefill instance, one short one on its decode
instance, one whose client left after its first token), the page draws a waterfall for each:
the phases GET /dashboard/requests has, as SVG bars in their order along the time axis and
labelled in ms, one bar per model layer for the KV, the events as marks (an abort for the
request that was left), and the browser console has no error. A failing test saves a
screenshot of the page (under its pytest tmp dir).
"""

from __future__ import annotations

import contextlib

import pytest
from http_helpers import OpenStream, http_json, start_cluster, stop
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from benchmarks.browser.chromium import close_browser, console_errors, open_browser
from minipd.models.arch.model_config import preset_config

NUM_LAYERS = preset_config("tiny").num_layers
PAGE_TIMEOUT_S = 60.0  # a snapshot comes every second; this bounds a wait for a change, on a busy machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = start_cluster(
        tmp_path_factory.mktemp("timelines-browser"),
        *("--model", "tiny", "--dtype", "float32", "--max-num-batched-tokens", "64"),
        *("--local-prefill-max-tokens", "16"),
    )
    try:
        yield server
    finally:
        stop(server)


@pytest.fixture
def browser():
    driver = open_browser()
    try:
        yield driver
    finally:
        close_browser(driver)


@contextlib.contextmanager
def screenshot_on_failure(driver, tmp_path):
    try:
        yield
    except BaseException:
        path = tmp_path / "timelines-failure.png"
        driver.save_screenshot(str(path))
        print(f"screenshot of the failing page: {path}")
        raise


def complete(base_url: str, prompt: str, max_tokens: int) -> str:
    result = http_json(
        "POST", f"{base_url}/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens}
    )
    assert result.status == 200, result.body
    return result.body["id"]


def leave_after_first_token(base_url: str, prompt: str) -> str:
    stream = OpenStream(base_url, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 400})
    try:
        return stream.next_event()["id"]
    finally:
        stream.close()


def shown_phases(card) -> list[tuple[str, float, float, float]]:
    """(phase, its start in ms, its bar's left edge and width on the page) of a card's waterfall."""
    shown = []
    for group in card.find_elements(By.CSS_SELECTOR, "g.tl-phase"):
        rect = group.find_element(By.TAG_NAME, "rect")
        shown.append(
            (
                group.get_attribute("data-phase"),
                float(group.get_attribute("data-start-ms")),
                float(rect.get_attribute("x")),
                float(rect.get_attribute("width")),
            )
        )
    return shown


def test_the_page_draws_a_waterfall_per_request(cluster, browser, tmp_path):
    with screenshot_on_failure(browser, tmp_path):
        disaggregated = [complete(cluster.base_url, f"{word} " * 100, 5) for word in ("alpha", "beta")]
        local = complete(cluster.base_url, "hi", 3)
        left = leave_after_first_token(cluster.base_url, "gamma " * 100)
        sent = [*disaggregated, local, left]
        browser.get(f"{cluster.base_url}/dashboard")
        WebDriverWait(browser, PAGE_TIMEOUT_S, poll_frequency=0.2).until(
            lambda d: (
                {c.get_attribute("data-request-id") for c in d.find_elements(By.CSS_SELECTOR, ".tl")} >= set(sent)
            ),
            message="the page never drew a timeline for every request sent",
        )
        served = {
            t["request_id"]: t for t in http_json("GET", f"{cluster.base_url}/dashboard/requests").body["timelines"]
        }
        cards = {c.get_attribute("data-request-id"): c for c in browser.find_elements(By.CSS_SELECTOR, ".tl")}

        for request_id in sent:
            card, timeline = cards[request_id], served[request_id]
            phases = shown_phases(card)
            # every phase of the route's timeline is drawn, left to right in the order of its start
            assert sorted(p[0] for p in phases) == sorted(p["name"] for p in timeline["phases"])
            lefts = [left for _, _, left, _ in sorted(phases, key=lambda p: p[1])]
            assert lefts == sorted(lefts)
            assert all(width >= 1 for *_, width in phases)
            events = {e.get_attribute("data-event") for e in card.find_elements(By.CSS_SELECTOR, "g.tl-event")}
            assert events == {e["name"] for e in timeline["events"]}
            assert card.get_attribute("data-outcome") == timeline["outcome"]
            labels = " ".join(t.text for t in card.find_elements(By.CSS_SELECTOR, "text.tl-label"))
            assert " ms" in labels

        for request_id in disaggregated:
            card = cards[request_id]
            names = {p[0] for p in shown_phases(card)}
            assert {"reserve", "prefill", "chunk", "kv_transfer", "kv_exposed", "decode"} <= names
            assert len(card.find_elements(By.CSS_SELECTOR, "rect.tl-layer")) == NUM_LAYERS
            assert "prefill-" in card.find_element(By.CSS_SELECTOR, ".tl-head").text
            (transfer_label,) = [
                t.text for t in card.find_elements(By.CSS_SELECTOR, "g.ph-kv_transfer text") if t.text
            ] or ["(none)"]
            assert transfer_label.startswith("KV transfer ") and transfer_label.endswith(" ms")
        assert {p[0] for p in shown_phases(cards[local])} == {"queued", "generate", "decode"}
        assert cards[left].get_attribute("data-outcome") == "abort"
        assert cards[left].find_elements(By.CSS_SELECTOR, "g.ev-abort")

        # fewer shown on asking for fewer: the newest first
        Select(browser.find_element(By.ID, "timelines-count")).select_by_visible_text("5")
        shown = [c.get_attribute("data-request-id") for c in browser.find_elements(By.CSS_SELECTOR, ".tl")]
        assert shown[0] == left and len(shown) <= 5
        assert console_errors(browser) == []
