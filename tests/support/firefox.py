"""Debian's headless Firefox ESR for the dashboard's browser tests, driven over Marionette (its
own remote protocol, spoken by Mozilla's `marionette-driver` client), since no geckodriver for
Selenium is packaged here.

`open_firefox()` starts one on a free Marionette port with a fresh profile; `close_firefox`
ends it and removes the profile; `console_errors` reads the errors Firefox's console service
recorded for web pages (script errors and failed loads), from the browser's chrome context;
`wait_for` polls a predicate with a deadline.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Callable
from typing import TypeVar

from marionette_driver.marionette import Marionette

FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox")
STARTUP_TIMEOUT_S = 120  # a first start on a busy 2-core machine
POLL_S = 0.2
T = TypeVar("T")

# Every message of the console service that is an error (not a warning) from web content (not
# the browser's own chrome or its built-in resources): what a page's script threw or failed to load.
_PAGE_ERRORS_JS = """
const errors = [];
for (const m of Services.console.getMessageArray() || []) {
  if (!(m instanceof Ci.nsIScriptError) || (m.flags & Ci.nsIScriptError.warningFlag)) continue;
  if (m.isFromChromeContext || /^(chrome|resource|moz-extension):/.test(m.sourceName)) continue;
  errors.push(m.errorMessage + " (" + m.sourceName + ":" + m.lineNumber + ")");
}
return errors;
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def open_firefox() -> Marionette:
    if FIREFOX is None:
        raise RuntimeError("no firefox-esr on PATH (Debian: apt-get install firefox-esr)")
    client = Marionette(bin=FIREFOX, headless=True, port=_free_port(), startup_timeout=STARTUP_TIMEOUT_S)
    client.start_session()
    return client


def close_firefox(client: Marionette) -> None:
    """Quit the browser and remove its profile directory."""
    profile = client.instance.profile if client.instance is not None else None
    client.cleanup()
    if profile is not None:
        profile.cleanup()
        profile.restore = False  # removed now: its __del__ at interpreter exit must not try again


def console_errors(client: Marionette) -> list[str]:
    with client.using_context(client.CONTEXT_CHROME):
        return client.execute_script(_PAGE_ERRORS_JS)


def wait_for(predicate: Callable[[], T], what: str, timeout_s: float) -> T:
    """The first truthy value of `predicate()`, polled until `timeout_s`; AssertionError naming
    `what` otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"the page never showed {what} within {timeout_s} s"
        time.sleep(POLL_S)  # polling the page, bounded by the deadline
