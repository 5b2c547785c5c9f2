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
  sorts ``--gil-floats`` random floats (default 2 million: 0.65-0.8 s per ``sorted()`` on the
  project's machine kind) back to back, as an application's pandas or JSON work holds the GIL.
  No other thread of the process runs while one ``sorted()`` call lasts, and between two calls
  a waiting thread gets the GIL only until its switch interval (5 ms) runs out: back to back,
  the tests' own Python code runs at about 1/100 of its speed (``--gil-pause`` leaves pauses).
  It is started by this file loaded as a pytest plugin (``-p busy_machine_tests``), and it
  reports the holds it made.

Arguments after ``--`` go to pytest unchanged. The exit status is pytest's (of the last failing
run, 0 when every run passed). Each run's outcome, duration and load average are printed.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = Path(__file__).stem
FLOATS_ENV = "BUSY_MACHINE_GIL_FLOATS"
PAUSE_ENV = "BUSY_MACHINE_GIL_PAUSE"
DEFAULT_FLOATS = 2_000_000

# -- the pytest plugin (this module, loaded with -p) ------------------------------------------

_holds: list[float] = []


def _hold_the_gil(count: int, pause: float) -> None:
    data = [random.random() for _ in range(count)]
    while True:
        started = time.perf_counter()
        sorted(data)  # one C call: the GIL is not released until it returns
        _holds.append(time.perf_counter() - started)
        if pause > 0:
            time.sleep(pause)


def pytest_configure(config: Any) -> None:
    count = int(os.environ.get(FLOATS_ENV, DEFAULT_FLOATS))
    if count > 0:
        pause = float(os.environ.get(PAUSE_ENV, "0"))
        threading.Thread(target=_hold_the_gil, args=(count, pause), name="gil-holder", daemon=True).start()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    holds = list(_holds)
    if holds:
        terminalreporter.write_line(
            f"busy machine: the GIL-holding thread held the GIL {len(holds)} times, "
            f"{min(holds):.2f} / {statistics.median(holds):.2f} / {max(holds):.2f} s (min / median / max)"
        )


# -- the runner ---------------------------------------------------------------------------------

HOG = "while True:\n    pass\n"


def run_once(pytest_args: list[str], floats: int, pause: float) -> tuple[int, float]:
    env = {**os.environ, FLOATS_ENV: str(floats), PAUSE_ENV: str(pause)}
    # This directory on the path, so that pytest can import this file as a plugin.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "pytest", *(["-p", PLUGIN] if floats > 0 else []), *pytest_args]
    print(f"$ {' '.join(command)}", flush=True)
    started = time.monotonic()
    status = subprocess.call(command, cwd=ROOT, env=env)
    return status, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hogs", type=int, default=2, help="CPU hog processes (default 2)")
    parser.add_argument("--gil-floats", type=int, default=DEFAULT_FLOATS,
                        help=f"floats sorted per GIL hold (default {DEFAULT_FLOATS:,})")
    parser.add_argument("--gil-pause", type=float, default=0.0,
                        help="seconds between two holds (default 0: back to back)")
    parser.add_argument("--no-gil", action="store_true", help="no GIL-holding thread in the test process")
    parser.add_argument("--runs", type=int, default=1, help="runs in a row (default 1)")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = parser.parse_args()
    if args.hogs < 0 or args.runs < 1 or args.gil_floats < 0 or args.gil_pause < 0:
        parser.error(f"expected --hogs >= 0, --runs >= 1, --gil-floats >= 0, --gil-pause >= 0; got {args.hogs}, "
                     f"{args.runs}, {args.gil_floats}, {args.gil_pause}")
    floats = 0 if args.no_gil else args.gil_floats
    # Terminated (a CI job's timeout): still stop pytest (subprocess.call kills it) and the hogs.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    outcomes: list[tuple[int, float, float]] = []
    try:
        for _ in range(args.runs):
            status, took = run_once(args.pytest_args, floats, args.gil_pause)
            outcomes.append((status, took, os.getloadavg()[0]))
    finally:
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            hog.wait()
    pause = "back to back" if args.gil_pause == 0 else f"{args.gil_pause:g} s apart"
    gil = "no GIL-holding thread" if floats == 0 else f"a GIL-holding thread ({floats:,} floats per sorted(), {pause})"
    print(f"\nbusy machine: {args.hogs} CPU hogs, {gil}, {os.cpu_count()} cores")
    for number, (status, took, load) in enumerate(outcomes, 1):
        verdict = "passed" if status == 0 else f"FAILED (pytest exit status {status})"
        print(f"run {number}: {verdict} in {took:.0f} s, load average {load:.1f} at its end")
    failed = [status for status, _, _ in outcomes if status != 0]
    return failed[-1] if failed else 0


if __name__ == "__main__":
    sys.exit(main())
