"""Waiting for a state the pool reaches in the background (a refresh, a probe), with a bound."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Return once ``condition()`` holds; fail naming ``what`` when ``timeout`` seconds pass
    first. Polled every 20 ms: the state comes from another thread, with no event to wait on."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.02)
