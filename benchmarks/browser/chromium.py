"""Debian's headless Chromium (`chromium`, `chromium-driver`) under Selenium, for the dashboard.

`open_browser()` starts one with its console log kept (`console_errors` reads it), a fixed
window size (screenshots are comparable), no network beyond what the page asks of its own
server, and any extra switches a caller adds (a name mapped to this host, say); `close_browser`
ends it and its chromedriver; `browser_session()` is both around a `with` body.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.keys import Keys

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WINDOW = (1440, 1500)


def open_browser(window: tuple[int, int] = WINDOW, extra_args: Sequence[str] = ()) -> webdriver.Chrome:
    """A headless Chromium with the options above and `extra_args` after them (e.g.
    `--host-resolver-rules=MAP evil.example 127.0.0.1`, a name served by this host)."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).exists():
            raise FileNotFoundError(f"{path} missing: install Debian's {package} package (.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--window-size={window[0]},{window[1]}",
        *extra_args,
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """The console's SEVERE entries since the last call (the log is drained as it is read)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def close_browser(driver: webdriver.Chrome) -> None:
    driver.quit()


@contextlib.contextmanager
def browser_session(**options) -> Iterator[webdriver.Chrome]:
    """`open_browser(**options)` for a `with` body (a fixture's `yield`), closed after it."""
    driver = open_browser(**options)
    try:
        yield driver
    finally:
        close_browser(driver)


def type_into(box, value) -> None:
    """Replace what a text box holds with ``value``, as a user does: focus it, select all, type.

    Not ``clear()`` then ``send_keys()``: WebDriver's clear blurs the box, and the dashboard
    refills an unfocused, untouched box from its next push, so a push landing between the two
    calls left the old value in front of the typed one. A focused box is never refilled.
    """
    box.click()
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(str(value))
