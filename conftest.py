"""Guards for the project's own test runs (``pytest`` from the checkout: tests/ and integration/).

A hung run is the one failure CI cannot report: the job is killed at its time limit and what
hung is lost. pytest-timeout bounds each test (300 s, pyproject.toml) with a signal, but not a
hang the signal cannot interrupt (its handler runs on the main thread, between two bytecodes:
a main thread blocked in C on a lock held forever never gets there), nor the interpreter's
exit, which joins every non-daemon thread left running. So a watchdog thread bounds each test
(its pytest-timeout plus a grace), the whole run and, once pytest is done, its exit: past a
bound it prints every thread's stack and ends the process with status 70, a failure that says
what hung.

Seconds, from the environment: ``CLICKHOUSE_LB_TEST_TIMEOUT_GRACE`` (default 60),
``CLICKHOUSE_LB_TEST_RUN_LIMIT`` (default 2400), ``CLICKHOUSE_LB_TEST_EXIT_LIMIT`` (default 120);
0 turns a bound off (a debugger session, say).
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
GRACE_ENV = "CLICKHOUSE_LB_TEST_TIMEOUT_GRACE"


def _limit(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        raise pytest.UsageError(f"{name} must be a number of seconds, not {raw!r}") from None


class _RunWatchdog:
    """One daemon thread that ends the process, with every thread's stack, when the earliest of
    its bounds (by name: the run, the test running) passes."""

    def __init__(self, stderr_fd: int) -> None:
        self._stderr_fd = stderr_fd
        self._changed = threading.Condition()
        self._bounds: dict[str, tuple[float, str]] = {}
        threading.Thread(target=self._watch, name="test-run-watchdog", daemon=True).start()

    def bound(self, name: str, seconds: float, what: str) -> None:
        with self._changed:
            if seconds > 0:
                self._bounds[name] = (time.monotonic() + seconds, f"{what} took over {seconds:g} s")
            else:
                self._bounds.pop(name, None)
            self._changed.notify()

    def clear(self, name: str) -> None:
        self.bound(name, 0, "")

    def _watch(self) -> None:
        with self._changed:
            while True:
                if not self._bounds:
                    self._changed.wait()
                    continue
                deadline, what = min(self._bounds.values())
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
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
    _watchdog.bound("run", _limit(RUN_LIMIT_ENV, 2400.0), f"the test run ({RUN_LIMIT_ENV})")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """A test (setup and teardown included) that pytest-timeout did not end within a minute of
    its timeout is hung where the timeout cannot reach: a signal handler runs on the main thread
    only, between two bytecodes, so a main thread blocked in C on a lock that another thread
    holds forever never sees it."""
    timeout = _test_timeout(item)
    if _watchdog is not None and timeout > 0:
        grace = _limit(GRACE_ENV, 60.0)
        _watchdog.bound("test", timeout + grace, f"{item.nodeid} (its pytest-timeout {timeout:g} s + {GRACE_ENV})")
    try:
        return (yield)
    finally:
        if _watchdog is not None:
            _watchdog.clear("test")


def _test_timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    try:
        return float(item.config.getini("timeout") or 0)
    except ValueError:  # no pytest-timeout: no ini option of that name
        return 0.0


def pytest_unconfigure(config: pytest.Config) -> None:
    if _watchdog is not None:
        # What remains is the interpreter's exit: it joins every non-daemon thread still running.
        _watchdog.clear("run")
        _watchdog.bound("exit", _limit(EXIT_LIMIT_ENV, 120.0), f"the exit after the test run ({EXIT_LIMIT_ENV})")
