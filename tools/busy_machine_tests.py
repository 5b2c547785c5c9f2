"""Run the README's test command (``pytest``) on a machine made busy on purpose, and say whether
it passed: the conditions a new user's 2-core laptop or a shared CI runner gives the suite.

    python tools/busy_machine_tests.py                       # the whole suite, once
    python tools/busy_machine_tests.py --runs 3              # three runs in a row
    python tools/busy_machine_tests.py -- tests/ integration/test_pool.py -q
    python tools/busy_machine_tests.py --hogs 0 --no-gil -- tests/   # an unloaded baseline

What makes the machine busy:

- ``--hogs`` CPU hogs (default 2): processes spinning in a loop, competing for the cores with
  the tests and the local cluster's replicas;
- a GIL-holding thread in the test process itself (unless ``--no-gil``): a daemon thread that
  holds the GIL ``--gil-hold`` seconds at a time (default 0.8, one ``sorted()`` call, sized at
  the current load hold by hold: ``clickhouse_lb.testing.load.GilHolder``), ``--gil-pause``
  seconds apart (default 0.8), as an application's pandas or JSON work holds the GIL. No other
  thread of the process runs while one hold lasts. Back to back (``--gil-pause 0``), a waiting
  thread gets the GIL only until its switch interval (5 ms) runs out between two holds, and the
  tests' own Python code runs at about 1/160 of its speed: the suite's unit tests alone would
  take hours, so the default leaves the process half its time. It is started by this file loaded
  as a pytest plugin (``-p busy_machine_tests``), and it reports the holds it made.

Arguments after ``--`` go to pytest unchanged. The exit status is pytest's (of the last failing
run, 0 when every run passed). Each run's outcome, duration and load average are printed.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = Path(__file__).stem
HOLD_ENV = "BUSY_MACHINE_GIL_HOLD"
PAUSE_ENV = "BUSY_MACHINE_GIL_PAUSE"
DEFAULT_HOLD = 0.8
DEFAULT_PAUSE = 0.8

# -- the pytest plugin (this module, loaded with -p) ------------------------------------------

_holds: list[list[float]] = []


def pytest_configure(config: Any) -> None:
    hold = float(os.environ.get(HOLD_ENV, DEFAULT_HOLD))
    if hold > 0:
        # Sized at the current load, hold by hold: a fixed sort held the GIL 2-10 s instead of
        # 0.8 s on a loaded machine, which no application does.
        from clickhouse_lb.testing.load import GilHolder

        holder = GilHolder(hold, float(os.environ.get(PAUSE_ENV, "0")))
        _holds.append(holder.holds)
        holder.start()  # a daemon thread, for the rest of the run


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Skip the tests marked ``on_time_process``: they time the pool to sub-second bounds or
    simulate a stall and measure it against the real one, and a 0.8 s hold of this process
    inside the measured interval adds up to a second to it (a hedged read 0.975 s against its
    0.5 s bound, a 200 ms connect timeout's failover 0.97 s against 0.67 s, in a busy run).
    integration/test_stalls_under_load.py is the test of the pool inside a busy process."""
    if not _holds:  # no GIL holder in this run (pytest_configure started none)
        return
    import pytest

    skip = pytest.mark.skip(reason="needs a process that runs on time (this run's GIL-holding thread holds it up)")
    for item in items:
        if item.get_closest_marker("on_time_process") is not None:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    holds = list(_holds[0]) if _holds else []
    if holds:
        terminalreporter.write_line(
            f"busy machine: the GIL-holding thread held the GIL {len(holds)} times, "
            f"{min(holds):.2f} / {statistics.median(holds):.2f} / {max(holds):.2f} s (min / median / max)"
        )


# -- the runner ---------------------------------------------------------------------------------

HOG = "while True:\n    pass\n"


def run_once(pytest_args: list[str], hold: float, pause: float) -> tuple[int, float]:
    env = {**os.environ, HOLD_ENV: str(hold), PAUSE_ENV: str(pause)}
    # This directory on the path, so that pytest can import this file as a plugin.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "pytest", *(["-p", PLUGIN] if hold > 0 else []), *pytest_args]
    print(f"$ {' '.join(command)}", flush=True)
    started = time.monotonic()
    status = subprocess.call(command, cwd=ROOT, env=env)
    return status, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hogs", type=int, default=2, help="CPU hog processes (default 2)")
    parser.add_argument("--gil-hold", type=float, default=DEFAULT_HOLD,
                        help=f"seconds per GIL hold, sized at the current load (default {DEFAULT_HOLD:g})")
    parser.add_argument("--gil-pause", type=float, default=DEFAULT_PAUSE,
                        help=f"seconds between two holds (default {DEFAULT_PAUSE:g}; 0: back to back)")
    parser.add_argument("--no-gil", action="store_true", help="no GIL-holding thread in the test process")
    parser.add_argument("--runs", type=int, default=1, help="runs in a row (default 1)")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = parser.parse_args()
    if args.hogs < 0 or args.runs < 1 or args.gil_hold < 0 or args.gil_pause < 0:
        parser.error(f"expected --hogs >= 0, --runs >= 1, --gil-hold >= 0, --gil-pause >= 0; got {args.hogs}, "
                     f"{args.runs}, {args.gil_hold}, {args.gil_pause}")
    hold = 0.0 if args.no_gil else args.gil_hold
    # Terminated (a CI job's timeout): still stop pytest (subprocess.call kills it) and the hogs.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    outcomes: list[tuple[int, float, float]] = []
    try:
        for _ in range(args.runs):
            status, took = run_once(args.pytest_args, hold, args.gil_pause)
            outcomes.append((status, took, os.getloadavg()[0]))
    finally:
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            hog.wait()
    pause = "back to back" if args.gil_pause == 0 else f"{args.gil_pause:g} s apart"
    gil = "no GIL-holding thread" if hold == 0 else f"a GIL-holding thread ({hold:g} s holds, {pause})"
    print(f"\nbusy machine: {args.hogs} CPU hogs, {gil}, {os.cpu_count()} cores")
    for number, (status, took, load) in enumerate(outcomes, 1):
        verdict = "passed" if status == 0 else f"FAILED (pytest exit status {status})"
        print(f"run {number}: {verdict} in {took:.0f} s, load average {load:.1f} at its end")
    failed = [status for status, _, _ in outcomes if status != 0]
    return failed[-1] if failed else 0


if __name__ == "__main__":
    sys.exit(main())
