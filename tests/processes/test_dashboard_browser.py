"""The dashboard in a real browser: Debian's headless Chromium, driven by Selenium, against live
process clusters on `tiny` (router, one prefill and one decode process, TCP KV transport).

- the page shows the instances, roles and epochs that /admin/instances reports, and after
  known requests the figures /metrics has: finished requests, KV bytes moved, every
  instance's KV blocks; its KV tier panel says "no KV tier";
- its role-switch button switches an instance: the page and /admin/instances both say so;
- with `--api-key` and no key the page shows the key prompt and no data, its data routes
  answer 401 (a key in the URL is no key), and once the key is typed the data shows;
- a colocated instance (`--role both --port`) shows its one engine, and the requests it served;
- the Controls panel: the cluster flip to colocated and back shows the roles on the page and
  in /admin/instances (a refused flip's message shows next to it); a link cap set on the page
  makes the next request's KV transfer slower on /metrics and lifting it restores it; "start
  load" runs the built-in load to its end and fills the SLO panel; the controller toggle
  changes GET /admin/controller;
- the browser console has no error in any of these (read from Chromium's log).
Every test saves a screenshot of the page when it fails (under its pytest tmp dir).
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request

import openai
import pytest
from etcd_server import wait_until
from http_helpers import http_json, scrape, start_cluster, start_colocated, stop, wait_until_pools_full
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from benchmarks.browser.chromium import close_browser, console_errors, open_browser, type_into

API_KEY = "dashboard-test-key-0123456789"
PAGE_TIMEOUT_S = 60.0  # a snapshot comes every second; this bounds a wait for a change, on a busy machine
SWITCH_TIMEOUT_S = 60.0
NUM_REQUESTS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = start_cluster(tmp_path_factory.mktemp("dashboard"), "--model", "tiny", "--dtype", "float32")
    try:
        yield server
    finally:
        stop(server)


@pytest.fixture(scope="module")
def keyed_cluster(tmp_path_factory):
    server = start_cluster(
        tmp_path_factory.mktemp("dashboard-key"), "--model", "tiny", "--dtype", "float32", "--api-key", API_KEY
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
    """Run the body; when it fails, save what the page showed (and say where) before re-raising."""
    try:
        yield
    except BaseException:
        path = tmp_path / "dashboard-failure.png"
        driver.save_screenshot(str(path))
        print(f"screenshot of the failing page: {path}")
        raise


def wait_for(driver, predicate, what: str, timeout: float = PAGE_TIMEOUT_S):
    """Poll `predicate` until true. The page rebuilds its tables at every snapshot (each second), so an
    element a predicate found can be replaced before it is read: that read is retried, not a failure."""
    return WebDriverWait(
        driver, timeout, poll_frequency=0.2, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
    ).until(lambda d: predicate(d), message=f"the page never showed {what} within {timeout} s")


# One script reads the tables a snapshot rebuilds: the page's own script cannot run in between.
TABLE_FACTS_JS = """
const cell = document.querySelector('#lat-ttft td:nth-of-type(4)');
return {
  rows: document.querySelectorAll('#requests-table tbody tr').length,
  links: [...document.querySelectorAll('#links-table tbody tr[data-pair]')].map(r => r.dataset.pair),
  ttft_samples: cell ? Number(cell.textContent) : null,
  verdict: document.getElementById('verdict').dataset.verdict || null,
  kv_tier: [document.getElementById('kvtier-state').textContent, document.getElementById('kvtier-table').hidden],
};
"""


def cards(driver) -> dict[str, dict]:
    """The page's instance cards: id -> role, epoch, liveness and KV block figures as shown."""
    shown = {}
    for card in driver.find_elements(By.CSS_SELECTOR, ".inst"):
        used, cached, free = card.find_element(By.CSS_SELECTOR, '[data-field="blocks"]').text.split(" / ")
        shown[card.get_attribute("data-instance")] = {
            "role": card.find_element(By.CSS_SELECTOR, ".role").text,
            "epoch": int(card.find_element(By.CSS_SELECTOR, '[data-field="epoch"]').text),
            "liveness": card.get_attribute("data-liveness"),
            "used": int(used),
            "cached": int(cached),
            "free": int(free),
        }
    return shown


def admin_instances(base_url: str, key: str | None = None) -> dict[str, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(f"{base_url}/admin/instances", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return {i["instance"]: i for i in json.load(response)["instances"]}


def status_of(method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_page_shows_the_instances_and_roles_admin_reports(cluster, browser, tmp_path):
    with screenshot_on_failure(browser, tmp_path):
        reported = admin_instances(cluster.base_url)
        assert {i["role"] for i in reported.values()} == {"prefill", "decode"}
        browser.get(f"{cluster.base_url}/dashboard")
        wait_for(browser, lambda d: set(cards(d)) == set(reported), "every instance of /admin/instances")
        shown = cards(browser)
        for instance, info in reported.items():
            assert shown[instance]["role"] == info["role"]
            assert shown[instance]["epoch"] == info["epoch"]
            assert shown[instance]["liveness"] == "alive"
        pool_of = {"prefill": "pool-prefill", "decode": "pool-decode"}
        for instance, info in reported.items():
            pool = browser.find_element(By.ID, pool_of[info["role"]])
            assert pool.find_elements(By.CSS_SELECTOR, f'.inst[data-instance="{instance}"]')
        assert console_errors(browser) == []


def test_figures_agree_with_metrics(cluster, browser, tmp_path):
    with screenshot_on_failure(browser, tmp_path):
        browser.get(f"{cluster.base_url}/dashboard")
        wait_for(browser, lambda d: len(cards(d)) == 2, "the instances")
        before = int(browser.find_element(By.ID, "total-requests").text)
        client = openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="none", timeout=60)
        for i in range(NUM_REQUESTS):  # long enough to be prefilled remotely: their KV moves
            client.completions.create(
                model="tiny", prompt=f"request {i}: " + "prefill and decode apart " * 6, max_tokens=6
            )
        samples = wait_until_pools_full(cluster.base_url, timeout=PAGE_TIMEOUT_S)
        finished = sum(v for (name, _), v in samples.items() if name == "minipd_requests_total")
        kv_bytes = sum(v for (name, _), v in samples.items() if name == "minipd_kv_transfer_bytes_total")
        assert finished == before + NUM_REQUESTS and kv_bytes > 0
        wait_for(
            browser,
            lambda d: (
                int(d.find_element(By.ID, "total-requests").text) == finished
                and int(d.find_element(By.ID, "total-kv-bytes").get_attribute("data-bytes")) == kv_bytes
                and all(c["used"] == 0 for c in cards(d).values())
            ),
            f"{finished:g} requests and {kv_bytes:g} KV bytes (as /metrics)",
        )

        def blocks_agree(d) -> bool:
            # the page's snapshot and /metrics read the instances' stats at different moments
            # (blocks move from used to cached as requests end), so both are read until they meet
            samples = scrape(cluster.base_url)
            return all(
                shown[field] == samples[(f"minipd_kv_blocks_{field}", frozenset({("instance", instance)}))]
                for instance, shown in cards(d).items()
                for field in ("used", "cached", "free")
            )

        wait_for(browser, blocks_agree, "KV blocks used, cached and free per instance as /metrics")
        facts = browser.execute_script(TABLE_FACTS_JS)
        assert facts["rows"] >= NUM_REQUESTS
        assert facts["links"] == ["prefill-0->decode-0"]
        assert facts["ttft_samples"] >= NUM_REQUESTS  # every request of the window had its first token
        assert facts["verdict"] in ("met", "violated")
        assert facts["kv_tier"] == [
            "no KV tier",
            True,
        ]  # no instance has a tier (its panel: test_dashboard_kv_tier_browser.py)
        assert console_errors(browser) == []


def test_role_switch_button_switches_the_instance(cluster, browser, tmp_path):
    with screenshot_on_failure(browser, tmp_path):
        before = admin_instances(cluster.base_url)
        (prefill,) = [i for i, info in before.items() if info["role"] == "prefill"]
        browser.get(f"{cluster.base_url}/dashboard")
        wait_for(browser, lambda d: cards(d).get(prefill, {}).get("role") == "prefill", f"{prefill} as prefill")
        card = browser.find_element(By.CSS_SELECTOR, f'.inst[data-instance="{prefill}"]')
        assert card.find_element(By.CSS_SELECTOR, ".switch-to").get_attribute("value") == "decode"
        card.find_element(By.CSS_SELECTOR, "button.switch").click()
        wait_for(
            browser,
            lambda d: (
                cards(d)[prefill]["role"] == "decode" and cards(d)[prefill]["epoch"] == before[prefill]["epoch"] + 1
            ),
            f"{prefill} as a decode instance",
            SWITCH_TIMEOUT_S,
        )
        after = admin_instances(cluster.base_url)
        assert after[prefill]["role"] == "decode" and after[prefill]["epoch"] == before[prefill]["epoch"] + 1
        assert browser.find_element(By.ID, "pool-decode").find_elements(
            By.CSS_SELECTOR, f'.inst[data-instance="{prefill}"]'
        )
        assert "is decode now, epoch" in browser.find_element(By.ID, "message").text
        assert console_errors(browser) == []


def test_with_an_api_key_the_page_shows_nothing_until_the_key_is_given(keyed_cluster, browser, tmp_path):
    base = keyed_cluster.base_url
    with screenshot_on_failure(browser, tmp_path):
        assert status_of("GET", f"{base}/dashboard") == 200  # the page itself holds no data
        for method, path, body in (
            ("GET", "/dashboard/events", None),
            ("GET", "/dashboard/snapshot", None),
            ("POST", "/dashboard/slo", b'{"ttft_ms": 100, "itl_ms": 10}'),
            ("GET", "/admin/instances", None),
        ):
            headers = {"Content-Type": "application/json"} if body else {}
            assert status_of(method, f"{base}{path}", headers, body) == 401, path
            assert status_of(method, f"{base}{path}?api_key={API_KEY}", headers, body) == 401, path
        assert status_of("GET", f"{base}/dashboard/snapshot", {"Authorization": f"Bearer {API_KEY}"}) == 200

        browser.get(f"{base}/dashboard")
        wait_for(browser, lambda d: d.find_element(By.ID, "key-dialog").is_displayed(), "the key prompt")
        wait_for(browser, lambda d: d.execute_script("return document.readyState") == "complete", "a loaded page")
        assert browser.find_elements(By.CSS_SELECTOR, ".inst") == []
        assert browser.find_element(By.ID, "total-requests").text == "0"
        assert browser.find_element(By.ID, "status").text == "API key needed"
        # the page made no data call without the key (the log would show a refused one)
        requests = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert not [r for r in requests if "/dashboard/events" in r or "/dashboard/snapshot" in r], requests

        browser.find_element(By.ID, "key-input").send_keys(API_KEY)
        browser.find_element(By.ID, "key-submit").click()
        reported = admin_instances(base, API_KEY)
        wait_for(browser, lambda d: set(cards(d)) == set(reported), "the instances once the key was given")
        assert not browser.find_element(By.ID, "key-dialog").is_displayed()
        assert browser.execute_script("return sessionStorage.getItem('minipd.apiKey')") == API_KEY
        assert all(
            API_KEY not in r
            for r in browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        )
        assert console_errors(browser) == []


def test_slo_set_from_the_page_is_the_one_judged(cluster, browser, tmp_path):
    with screenshot_on_failure(browser, tmp_path):
        browser.get(f"{cluster.base_url}/dashboard")
        wait_for(browser, lambda d: len(cards(d)) == 2, "the instances")
        for field, value in (("slo-ttft", "1234"), ("slo-itl", "56")):
            box = browser.find_element(By.ID, field)
            type_into(box, value)
        browser.find_element(By.ID, "slo-set").click()
        wait_for(browser, lambda d: d.find_element(By.ID, "h-ttft-slo").text == "SLO 1234 ms", "the new TTFT SLO")
        assert browser.find_element(By.ID, "h-itl-slo").text == "SLO 56.0 ms"
        snapshot = http_json("GET", f"{cluster.base_url}/dashboard/snapshot").body
        assert snapshot["slo"] == {"ttft_s": 1.234, "itl_s": 0.056, "source": "page"}
        assert console_errors(browser) == []


def test_a_colocated_instance_shows_its_engine_and_its_requests(browser, tmp_path):
    server = start_colocated(tmp_path, "--model", "tiny", "--dtype", "float32")
    try:
        with screenshot_on_failure(browser, tmp_path):
            client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=60)
            for i in range(2):
                client.completions.create(model="tiny", prompt=f"colocated {i}", max_tokens=4)
            browser.get(f"{server.base_url}/dashboard")
            wait_for(
                browser,
                lambda d: d.find_element(By.ID, "total-requests").text == "2" and len(cards(d)) == 1,
                "its engine and 2 requests",
            )
            (shown,) = cards(browser).values()
            assert shown["role"] == "both" and shown["liveness"] == "alive"
            assert browser.find_element(By.ID, "pool-colocated").find_elements(By.CSS_SELECTOR, ".inst")
            assert browser.find_elements(By.CSS_SELECTOR, ".inst .switch-to") == []  # no role switch on one engine
            assert console_errors(browser) == []
    finally:
        stop(server)


# ---- the Controls panel: every control clicked on the page, its effect read from the server ----
LOAD_REQUESTS = 6
LINK_PROMPT = "The KV of this prompt crosses the link from prefill to decode. " * 8  # ~500 tokens of KV


def roles_shown(driver) -> dict[str, str]:
    return {instance: shown["role"] for instance, shown in cards(driver).items()}


def transfer_s(base_url: str, tag: str) -> float:
    """One completion's KV transfer time, as the growth of minipd_kv_transfer_seconds on /metrics."""

    def totals():
        samples = scrape(base_url)
        return (
            sum(v for (name, _), v in samples.items() if name == "minipd_kv_transfer_seconds_sum"),
            sum(v for (name, _), v in samples.items() if name == "minipd_kv_transfer_seconds_count"),
        )

    before_s, before_n = totals()
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", timeout=120)
    client.completions.create(model="tiny", prompt=f"{tag} {LINK_PROMPT}", max_tokens=2)
    after_s, after_n = totals()
    assert after_n == before_n + 1
    return after_s - before_s


def refused_calls_only(errors: list[str], status: int) -> list[str]:
    """The console's errors less Chromium's own line for a response with this status (a refused
    control the page answered on itself, which the browser logs whatever the script does)."""
    return [e for e in errors if f"status of {status}" not in e]


def test_the_cluster_flip_shows_the_roles_on_the_page_and_in_admin(cluster, browser, tmp_path):
    base = cluster.base_url
    with screenshot_on_failure(browser, tmp_path):
        browser.get(f"{base}/dashboard")
        wait_for(
            browser,
            lambda d: len(cards(d)) == 2 and d.find_element(By.ID, "controls-panel").is_displayed(),
            "the controls",
        )
        box = browser.find_element(By.ID, "flip-prefill")
        type_into(box, "5")  # of 2 instances: refused, and said next to the control
        browser.find_element(By.ID, "flip-apply").click()
        wait_for(browser, lambda d: "prefill" in d.find_element(By.ID, "flip-error").text, "the refusal naming prefill")
        errors = console_errors(browser)  # Chromium's own line for the 400 only: the script threw nothing
        assert refused_calls_only(errors, 400) == [] and len(errors) <= 1, errors

        browser.find_element(By.ID, "flip-colocated").click()
        browser.find_element(By.ID, "flip-apply").click()
        wait_for(
            browser, lambda d: set(roles_shown(d).values()) == {"both"}, "every instance colocated", SWITCH_TIMEOUT_S
        )
        assert {i["role"] for i in admin_instances(base).values()} == {"both"}
        assert len(browser.find_element(By.ID, "pool-colocated").find_elements(By.CSS_SELECTOR, ".inst")) == 2
        assert browser.find_element(By.ID, "flip-error").text == ""

        browser.find_element(By.ID, "flip-split").click()
        box = browser.find_element(By.ID, "flip-prefill")
        type_into(box, "1")
        browser.find_element(By.ID, "flip-apply").click()
        wait_for(
            browser,
            lambda d: sorted(roles_shown(d).values()) == ["decode", "prefill"],
            "a 1P:1D split",
            SWITCH_TIMEOUT_S,
        )
        assert sorted(i["role"] for i in admin_instances(base).values()) == ["decode", "prefill"]
        assert "1P:1D" in browser.find_element(By.ID, "flip-result").text
        assert console_errors(browser) == []


def test_a_link_cap_set_on_the_page_slows_the_next_transfer_and_lifting_restores(cluster, browser, tmp_path):
    base = cluster.base_url
    with screenshot_on_failure(browser, tmp_path):
        # the module's cluster was flipped to colocated and split again just before: wait for its prefill
        prefills = lambda: [i for i, info in admin_instances(base).items() if info["role"] == "prefill"]  # noqa: E731
        wait_until(lambda: len(prefills()) == 1, SWITCH_TIMEOUT_S, "one prefill instance in /admin/instances")
        (prefill,) = prefills()
        browser.get(f"{base}/dashboard")
        row_css = f'#link-cap-rows .cap-row[data-instance="{prefill}"]'
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row_css), f"a link cap row for {prefill}")
        row = browser.find_element(By.CSS_SELECTOR, row_css)
        transfer_s(base, "warm")  # the first transfer to a decode peer also connects the link
        free_s = transfer_s(base, "free")
        row.find_element(By.CSS_SELECTOR, ".cap-set").click()  # an empty box: refused on the page
        wait_for(browser, lambda d: "gbps" in row.find_element(By.CSS_SELECTOR, ".error").text, "the empty cap refused")
        row.find_element(By.CSS_SELECTOR, ".cap-gbps").send_keys("0.004")  # 0.5 MB/s
        row.find_element(By.CSS_SELECTOR, ".cap-set").click()
        wait_for(browser, lambda d: row.get_attribute("data-gbps") == "0.004", "the cap set")
        try:
            slow_s = transfer_s(base, "capped")
        finally:
            row.find_element(By.CSS_SELECTOR, ".cap-lift").click()
            wait_for(browser, lambda d: row.get_attribute("data-gbps") == "null", "the cap lifted")
        assert row.find_element(By.CSS_SELECTOR, ".cap-state").text == "uncapped"
        assert slow_s > 0.5 and slow_s > 5 * free_s, (free_s, slow_s)
        again_s = transfer_s(base, "lifted")
        assert again_s < slow_s / 3, (again_s, slow_s)
        assert console_errors(browser) == []


def test_start_load_on_the_page_fills_the_slo_panel(cluster, browser, tmp_path):
    base = cluster.base_url
    with screenshot_on_failure(browser, tmp_path):
        browser.get(f"{base}/dashboard")
        wait_for(browser, lambda d: d.find_element(By.ID, "load-form").is_displayed(), "the load controls")
        for field, value in (("load-value", "20"), ("load-count", str(LOAD_REQUESTS)), ("load-duration", "100")):
            box = browser.find_element(By.ID, field)
            type_into(box, value)
        browser.find_element(By.ID, "load-start").click()
        progress = browser.find_element(By.ID, "load-progress")
        wait_for(
            browser,
            lambda d: progress.get_attribute("data-state") == "finished",
            "the load run to its end",
            SWITCH_TIMEOUT_S,
        )
        assert progress.get_attribute("data-completed") == str(LOAD_REQUESTS)
        assert f"completed {LOAD_REQUESTS}, failed 0" in progress.text
        assert http_json("GET", f"{base}/admin/load").body["completed"] == LOAD_REQUESTS
        wait_for(
            browser,
            lambda d: (
                int(d.find_element(By.CSS_SELECTOR, "#lat-ttft td:nth-of-type(4)").text) >= LOAD_REQUESTS
                and d.find_element(By.CSS_SELECTOR, "#lat-ttft td:nth-of-type(2)").text.endswith(" ms")
                and d.find_element(By.CSS_SELECTOR, "#lat-itl td:nth-of-type(2)").text.endswith(" ms")
            ),
            "TTFT and ITL figures of the load",
        )
        assert console_errors(browser) == []


def test_the_controller_toggle_changes_admin_controller(cluster, browser, tmp_path):
    base = cluster.base_url
    with screenshot_on_failure(browser, tmp_path):
        assert http_json("GET", f"{base}/admin/controller").body["on"] is False
        browser.get(f"{base}/dashboard")
        wait_for(browser, lambda d: d.find_element(By.ID, "ctl-form").is_displayed(), "the controller controls")
        for field, value in (("ctl-ttft", "2000"), ("ctl-itl", "200")):
            box = browser.find_element(By.ID, field)
            type_into(box, value)
        browser.find_element(By.ID, "ctl-on").click()
        browser.find_element(By.ID, "ctl-apply").click()
        wait_for(browser, lambda d: d.find_element(By.ID, "controller-state").text == "on", "the controller on")
        state = http_json("GET", f"{base}/admin/controller").body
        assert state["on"] is True and state["slo"] == {"ttft_ms": 2000.0, "itl_ms": 200.0}, state
        browser.find_element(By.ID, "ctl-on").click()
        browser.find_element(By.ID, "ctl-apply").click()
        wait_for(browser, lambda d: d.find_element(By.ID, "controller-state").text == "off", "the controller off")
        assert http_json("GET", f"{base}/admin/controller").body["on"] is False
        assert console_errors(browser) == []
