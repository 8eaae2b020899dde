"""The dashboard in Firefox as well as Chromium: Debian's headless Firefox ESR, driven over
Marionette (tests/support/firefox.py), against a live `tiny` cluster (router, one prefill and
one decode process). The Chromium tests (test_dashboard_browser.py, test_plan_view_browser.py)
cover every panel and control; this one checks the same page in the other engine end to end:

- the Live view draws the instances /admin/instances lists, with their roles, and the
  requests /metrics counted, from the server-sent snapshots, which keep arriving;
- a control posts from the page: the SLO typed into the form is the one the server judges;
- the Plan view draws its bars from the planner;
- Firefox's console has no error from the page.
"""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest
from firefox import FIREFOX, close_firefox, console_errors, open_firefox, wait_for
from http_helpers import http_json, start_cluster, stop
from marionette_driver import By
from marionette_driver.keys import Keys

if FIREFOX is None:
    pytest.skip(
        "Firefox ESR is not installed (Debian: apt-get install firefox-esr; .ci/run does)", allow_module_level=True
    )

PAGE_TIMEOUT_S = 60.0  # a snapshot comes every second; this bounds a wait for a change, on a busy machine
PLAN_TIMEOUT_S = 120.0  # the plan worker's first start and its simulations
NUM_REQUESTS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = start_cluster(tmp_path_factory.mktemp("dashboard-firefox"), "--model", "tiny", "--dtype", "float32")
    try:
        yield server
    finally:
        stop(server)


@pytest.fixture
def firefox():
    client = open_firefox()
    try:
        yield client
    finally:
        close_firefox(client)


def cards(client) -> dict[str, str]:
    """The page's instance cards: id -> role, as shown."""
    return {
        card.get_attribute("data-instance"): card.find_element(By.CSS_SELECTOR, ".role").text
        for card in client.find_elements(By.CSS_SELECTOR, ".inst")
    }


def snapshot_time(client) -> float | None:
    # in the page's own scope (sandbox=None): the default sandbox sees no property a page script set
    return client.execute_script("return window.minipdLatest ? window.minipdLatest.time : null", sandbox=None)


def test_the_live_view_a_control_and_the_plan_view_work_in_firefox(cluster, firefox):
    llm = openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="none", timeout=60)
    for i in range(NUM_REQUESTS):
        llm.completions.create(model="tiny", prompt=f"firefox {i}", max_tokens=4)
    with urllib.request.urlopen(f"{cluster.base_url}/admin/instances", timeout=30) as response:
        listed = {i["instance"]: i["role"] for i in json.load(response)["instances"]}

    firefox.navigate(f"{cluster.base_url}/dashboard")
    wait_for(lambda: cards(firefox) == listed, f"the instances {listed}", PAGE_TIMEOUT_S)
    wait_for(
        lambda: firefox.find_element(By.ID, "total-requests").text == str(NUM_REQUESTS),
        f"{NUM_REQUESTS} finished requests",
        PAGE_TIMEOUT_S,
    )
    first = snapshot_time(firefox)
    wait_for(lambda: (snapshot_time(firefox) or 0) > first, "a newer snapshot", PAGE_TIMEOUT_S)

    for field, value in (("slo-ttft", "4321"), ("slo-itl", "65")):
        box = firefox.find_element(By.ID, field)
        box.click()  # focused: the next push leaves it alone
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(value)
    firefox.find_element(By.ID, "slo-set").click()
    wait_for(
        lambda: firefox.find_element(By.ID, "h-ttft-slo").text == "SLO 4321 ms", "the new TTFT SLO", PAGE_TIMEOUT_S
    )
    snapshot = http_json("GET", f"{cluster.base_url}/dashboard/snapshot").body
    assert snapshot["slo"] == {"ttft_s": 4.321, "itl_s": 0.065, "source": "page"}

    firefox.find_element(By.ID, "tab-plan").click()
    wait_for(
        lambda: firefox.find_element(By.ID, "plan-panel").get_attribute("data-state") == "drawn",
        "the plan drawn",
        PLAN_TIMEOUT_S,
    )
    bars = firefox.find_elements(By.CSS_SELECTOR, "#plan-bars g.plan-bar")
    assert len(bars) >= 2, "one bar per P:D split"
    assert console_errors(firefox) == []


def test_the_console_reader_sees_an_error_a_page_throws(firefox):
    # the check above is only as good as its reader: a page that throws must show in it
    firefox.navigate("data:text/html,<script>throw new Error('thrown by the page')</script>")
    errors = wait_for(lambda: console_errors(firefox), "the thrown error in the console", PAGE_TIMEOUT_S)
    assert any("thrown by the page" in e for e in errors), errors
