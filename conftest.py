"""Guards for the project's own test runs (``pytest`` from the checkout: tests/ and integration/).

A hung run is the one failure CI cannot report: the job is killed at its time limit and what
hung is lost. pytest-timeout bounds each test (300 s, pyproject.toml), but not a hang it cannot
interrupt (a thread blocked in C while the main thread waits on it) nor the interpreter's exit,
which joins every non-daemon thread left running. So a watchdog thread bounds the whole run and,
once pytest is done, its exit: past either bound it prints every thread's stack and ends the
process with status 70, a failure that says what hung.

``CLICKHOUSE_LB_TEST_RUN_LIMIT`` (seconds, default 2400) and ``CLICKHOUSE_LB_TEST_EXIT_LIMIT``
(default 120) change the bounds; 0 turns a guard off (a debugger session, say).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

import pytest

RUN_LIMIT_ENV = "CLICKHOUSE_LB_TEST_RUN_LIMIT"
EXIT_LIMIT_ENV = "CLICKHOUSE_LB_TEST_EXIT_LIMIT"
HUNG_STATUS = 70  # EX_SOFTWARE


def _limit(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        raise pytest.UsageError(f"{name} must be a number of seconds, not {raw!r}") from None


class _RunWatchdog:
    """One daemon thread that ends the process, with every thread's stack, when a bound passes."""

    def __init__(self, stderr_fd: int) -> None:
        self._stderr_fd = stderr_fd
        self._changed = threading.Condition()
        self._deadline: float | None = None
        self._what = ""
        threading.Thread(target=self._watch, name="test-run-watchdog", daemon=True).start()

    def bound(self, seconds: float, what: str) -> None:
        with self._changed:
            self._deadline = time.monotonic() + seconds if seconds > 0 else None
            self._what = f"{what} took over {seconds:g} s"
            self._changed.notify()

    def _watch(self) -> None:
        with self._changed:
            while True:
                if self._deadline is None:
                    self._changed.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            what = self._what
        os.write(self._stderr_fd, f"\n\nclickhouse-lb test guard: {what}; every thread's stack follows.\n".encode())
        faulthandler.dump_traceback(file=self._stderr_fd, all_threads=True)
        os._exit(HUNG_STATUS)


_watchdog: _RunWatchdog | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _watchdog
    if hasattr(config, "workerinput"):  # an xdist worker: its controller guards the run
        return
    # pytest captures file descriptor 2 while a test runs, and a process ended with os._exit()
    # never prints what was captured: the guard writes to a copy of the real one, taken here,
    # where pytest is not capturing.
    _watchdog = _RunWatchdog(os.dup(sys.stderr.fileno()))
    _watchdog.bound(_limit(RUN_LIMIT_ENV, 2400.0), f"the test run ({RUN_LIMIT_ENV})")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _watchdog is not None:
        # What remains is the interpreter's exit: it joins every non-daemon thread still running.
        _watchdog.bound(_limit(EXIT_LIMIT_ENV, 120.0), f"the exit after the test run ({EXIT_LIMIT_ENV})")
