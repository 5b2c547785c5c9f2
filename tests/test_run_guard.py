"""The checkout's conftest.py turns a hung test run into a failure that shows what hung.

Each case runs pytest in a subprocess, in a folder of its own holding a copy of that conftest.py
and one test file, with a bound of 1 s: the hang must end the run with status 70 and the stack
of the thread that hung, where without the guard the run would never end (CI would be killed at
its time limit with nothing to say)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HUNG_AT_EXIT = """
    import threading

    def waits_for_nobody():
        threading.Event().wait()

    def test_leaves_a_thread_behind():
        threading.Thread(target=waits_for_nobody, name="left-behind").start()
"""

# SIGALRM blocked on the main thread: pytest-timeout's signal reaches another thread, whose C
# handler only sets a flag; the main thread, waiting on a lock, never runs the Python handler.
OUT_OF_THE_TIMEOUTS_REACH = """
    import signal
    import threading

    import pytest

    @pytest.mark.timeout(1)
    def test_blocked_where_no_signal_reaches():
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
        threading.Event().wait(60)
"""

HUNG_IN_A_TEST = """
    import threading

    def test_waits_too_long():
        threading.Event().wait(60)
"""


def _run(tmp_path: Path, test_source: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_case.py").write_text(textwrap.dedent(test_source))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_case.py"],
        check=False, cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
    )


def test_a_run_whose_exit_hangs_fails_with_the_stack_of_the_thread_left_behind(tmp_path: Path) -> None:
    run = _run(tmp_path, HUNG_AT_EXIT, CLICKHOUSE_LB_TEST_EXIT_LIMIT="1")
    assert "1 passed" in run.stdout  # the test itself passed: only the exit hung
    assert run.returncode == 70, run.stderr
    assert "the exit after the test run (CLICKHOUSE_LB_TEST_EXIT_LIMIT) took over 1 s" in run.stderr
    assert "waits_for_nobody" in run.stderr


def test_a_run_past_its_bound_fails_with_the_stack_of_the_test_that_hung(tmp_path: Path) -> None:
    run = _run(tmp_path, HUNG_IN_A_TEST, CLICKHOUSE_LB_TEST_RUN_LIMIT="1")
    assert run.returncode == 70, run.stderr
    assert "the test run (CLICKHOUSE_LB_TEST_RUN_LIMIT) took over 1 s" in run.stderr
    assert "test_waits_too_long" in run.stderr


def test_a_test_its_timeout_cannot_end_fails_the_run_with_its_stack(tmp_path: Path) -> None:
    run = _run(tmp_path, OUT_OF_THE_TIMEOUTS_REACH, CLICKHOUSE_LB_TEST_TIMEOUT_GRACE="1")
    assert run.returncode == 70, run.stderr
    assert "test_case.py::test_blocked_where_no_signal_reaches (its pytest-timeout 1 s" in run.stderr
    assert "test_blocked_where_no_signal_reaches" in run.stderr.split("stack follows")[1]


def test_a_bound_that_is_not_a_number_is_refused_by_name(tmp_path: Path) -> None:
    run = _run(tmp_path, "def test_nothing():\n    pass\n", CLICKHOUSE_LB_TEST_RUN_LIMIT="soon")
    assert run.returncode != 0
    assert "CLICKHOUSE_LB_TEST_RUN_LIMIT must be a number of seconds, not 'soon'" in run.stdout + run.stderr


def test_a_guard_set_to_zero_is_off(tmp_path: Path) -> None:
    # with the exit guard off, the thread left behind keeps the process alive past the 1 s bound
    # the other test sees it ended at (and the subprocess is killed at this timeout)
    with pytest.raises(subprocess.TimeoutExpired):
        _run(tmp_path, HUNG_AT_EXIT, timeout=10, CLICKHOUSE_LB_TEST_EXIT_LIMIT="0")
