"""Waiting for the signal that stops a long-running role."""

from __future__ import annotations

import asyncio
import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def wait_for_stop_signal() -> None:
    """Return once SIGINT or SIGTERM arrives (Ctrl-C, or a launcher stopping its children)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
