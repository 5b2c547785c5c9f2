"""Load of the kind an application puts on the pool's process (for tests and benchmarks): a thread
that holds the GIL back to back (``sorted()`` of 2 million floats, most of a second per call, as
pandas or JSON work can) and CPU hogs in other processes (``python -c 'while 1: pass'``).

    with busy_process(gil_hold=0.8, hogs=2):
        ...  # the pool's threads get the GIL only between the holds
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

__all__ = ["Holds", "busy_process", "gil_holder_size"]


class Holds(list[float]):
    """The measured durations of the GIL holds (seconds), and ``first``: set when one ended (a
    busy machine stretches the holds: a test can size its waits from the first one)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = threading.Event()

    def append(self, hold: float) -> None:
        super().append(hold)
        self.first.set()


def gil_holder_size(hold: float) -> int:
    """How many floats ``sorted()`` takes about ``hold`` seconds to sort here (measured once)."""
    sample = [random.random() for _ in range(200_000)]
    started = time.perf_counter()
    sorted(sample)
    per_item = max(1e-9, (time.perf_counter() - started) / len(sample))
    return max(10_000, int(hold / per_item))


@contextlib.contextmanager
def busy_process(*, gil_hold: float = 0.8, hogs: int = 2, pause: float = 0.0) -> Iterator[Holds]:
    """Hold the GIL ``gil_hold`` seconds at a time (``pause`` seconds apart; 0: back to back;
    ``gil_hold=0``: no holder) while ``hogs`` processes spin; yields the measured hold durations.
    The hogs are started and killed here, by their own process ids."""
    holds = Holds()
    stop = threading.Event()
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(hogs)]
    thread = None
    if gil_hold > 0:
        data = [random.random() for _ in range(gil_holder_size(gil_hold))]

        def hold() -> None:
            while not stop.is_set():
                started = time.perf_counter()
                sorted(data)  # one C call: the GIL is not released until it returns
                holds.append(time.perf_counter() - started)
                if pause:
                    stop.wait(pause)

        thread = threading.Thread(target=hold, name="gil-holder", daemon=True)
        thread.start()
    try:
        yield holds
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
