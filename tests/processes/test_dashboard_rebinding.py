"""DNS rebinding in a real browser (issue 37): Debian's headless Chromium, driven by Selenium, with
two names mapped to 127.0.0.1 by its resolver (`--host-resolver-rules`), as a rebound DNS
answer would map them, against a live `minipd --role cluster` started with
`--allowed-hosts dashboard.test`:
- through an allowed name (`localhost`, and `dashboard.test`) the dashboard works: it shows the
  instances that /admin/instances reports, with no console error;
- through a foreign one (`evil.example`) the page gets the 403 naming --allowed-hosts and shows
  no data, and a script running on that origin gets 403 from /admin/link_cap (a request its
  browser sees as same-origin, the attack itself) and from /admin/instances, while its
  cross-origin POSTs to the server's real address get nowhere: the link cap, read back from
  the router, never changed.
"""

from __future__ import annotations

import json

import pytest
from http_helpers import http_json, serving, start_cluster
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from benchmarks.browser.chromium import close_browser, console_errors, open_browser

ALLOWED = "dashboard.test"
EVIL = "evil.example"
RESOLVER_RULES = f"--host-resolver-rules=MAP {EVIL} 127.0.0.1,MAP {ALLOWED} 127.0.0.1"
PAGE_TIMEOUT_S = 60.0  # a snapshot comes every second; this bounds a wait on a busy machine
SCRIPT_TIMEOUT_S = 30.0
CAP = {"instance": "prefill-0", "gbps": 0.001}

# Runs on the page's origin; answers {status, body} or {error} (a fetch the browser refused).
FETCH_JS = """
const [url, options, done] = arguments;
fetch(url, options)
  .then(async (response) => done({status: response.status, body: await response.text()}))
  .catch((error) => done({error: String(error)}));
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    flags = ("--model", "tiny", "--dtype", "float32", "--allowed-hosts", ALLOWED)
    with serving(start_cluster(tmp_path_factory.mktemp("rebinding-browser"), *flags)) as base:
        yield base


@pytest.fixture
def browser():
    driver = open_browser(extra_args=[RESOLVER_RULES])
    driver.set_script_timeout(SCRIPT_TIMEOUT_S)
    try:
        yield driver
    finally:
        close_browser(driver)


def port(base: str) -> str:
    return base.rsplit(":", 1)[1]


def link_caps(base: str) -> dict:
    result = http_json("GET", f"{base}/admin/link_cap")
    assert result.status == 200, result
    return result.body["link_caps"]


def shown_instances(driver) -> set[str]:
    return {card.get_attribute("data-instance") for card in driver.find_elements(By.CSS_SELECTOR, ".inst")}


def in_page(driver, url: str, **options) -> dict:
    return driver.execute_async_script(FETCH_JS, url, options)


@pytest.mark.parametrize("name", ["localhost", ALLOWED])
def test_the_dashboard_works_through_an_allowed_name(cluster, browser, name):
    reported = {i["instance"] for i in http_json("GET", f"{cluster}/admin/instances").body["instances"]}
    assert reported == {"prefill-0", "decode-0"}
    browser.get(f"http://{name}:{port(cluster)}/dashboard")
    WebDriverWait(
        browser, PAGE_TIMEOUT_S, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
    ).until(lambda d: shown_instances(d) == reported, message=f"the page at {name} never showed {reported}")
    assert console_errors(browser) == []


def test_a_rebound_name_gets_no_data_and_changes_nothing(cluster, browser):
    assert link_caps(cluster) == {}
    browser.get(f"http://{EVIL}:{port(cluster)}/dashboard")
    text = browser.find_element(By.TAG_NAME, "body").text
    assert "host_not_allowed" in text and f"--allowed-hosts {EVIL}" in text, text
    assert shown_instances(browser) == set()
    with pytest.raises(NoSuchElementException):
        browser.find_element(By.ID, "pool-prefill")  # not the dashboard's page at all

    # the attack: the evil page calls "its own" server, which its name now resolves to
    json_post = {"method": "POST", "headers": {"Content-Type": "application/json"}}
    answer = in_page(browser, "/admin/link_cap", **json_post, body=json.dumps(CAP))
    assert answer.get("status") == 403 and "host_not_allowed" in answer["body"], answer
    answer = in_page(browser, "/admin/instances")
    assert answer.get("status") == 403 and "prefill-0" not in answer["body"], answer

    # cross-origin to the server's real address: a JSON POST needs a preflight, which is not
    # granted; a "simple" one goes out but is refused (its Origin is another site's)
    real = f"{cluster}/admin/link_cap"
    answer = in_page(browser, real, **json_post, body=json.dumps(CAP))
    assert "error" in answer, answer
    answer = in_page(browser, real, method="POST", mode="no-cors", body=json.dumps(CAP))
    assert answer.get("status") == 0, answer  # opaque: the page learns nothing

    assert link_caps(cluster) == {}
