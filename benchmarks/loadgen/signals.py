"""Cleanup that an impatient second Ctrl-C (or a SIGTERM after the first) cannot cut short."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

DEFERRED = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs (every wait in it must be bounded):
    their handlers are swapped for one that only notes the signal, and the first one noted is
    raised again, to the handlers of before, once the block is done. Python runs signal
    handlers in the main thread only, whichever thread the kernel picked, so this holds with
    other threads running too; outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in DEFERRED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        signal.raise_signal(received[0])
