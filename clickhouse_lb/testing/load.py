"""Load of the kind an application puts on the pool's process (for tests and benchmarks): a thread
that holds the GIL back to back (``sorted()`` of 2 million floats, most of a second per call, as
pandas or JSON work can) and CPU hogs in other processes (``python -c 'while 1: pass'``).

    with busy_process(gil_hold=0.8, hogs=2):
        ...  # the pool's threads get the GIL only between the holds
"""

from __future__ import annotations

import contextlib
import ctypes
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

__all__ = ["GilHolder", "Holds", "busy_process", "gil_holder_size"]


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
    """How many floats ``sorted()`` takes about ``hold`` seconds to sort here, now (a first
    estimate: :class:`GilHolder` corrects it hold by hold)."""
    data = [random.random() for _ in range(GilHolder.MOST)]
    return GilHolder.first_size(data, hold)


class GilHolder:
    """A thread holding the GIL ``target`` seconds at a time, ``pause`` seconds apart (0: back
    to back), sized at the current load: each ``sorted()`` is timed and the next one's length
    scaled by ``target / measured``, damped (a hold stretched by a passing burst of load must not
    halve the next). A size measured once on a quiet machine held the GIL 1.2-2.4 s instead of
    0.8 s once the machine got busy, and a test's or benchmark's figure then said more about the
    holds than about the pool. ``holds``: every hold's measured duration.

    Sized or not, a hold that computes is stretched whenever the machine's CPUs are taken (two
    hogs on two cores: holds of 0.8 s median reach 1.1-2 s). ``exact=True`` holds the GIL for
    exactly ``target`` instead, computing nothing: one C call (libc's ``usleep`` through
    ``ctypes.PyDLL``, which keeps the GIL during the call) that the load cannot stretch."""

    #: The most floats a hold may sort (about 1.6 s of sorting on a quiet machine).
    MOST = 4_000_000

    def __init__(self, target: float = 0.8, pause: float = 0.0, *, exact: bool = False) -> None:
        self.target = target
        self.pause = pause
        self.exact = exact
        self.holds = Holds()
        self._stop = threading.Event()
        self._data = [] if exact else [random.random() for _ in range(self.MOST)]
        self._size = 0 if exact else self.first_size(self._data, target)
        self._thread = threading.Thread(target=self._hold, name="gil-holder", daemon=True)

    @staticmethod
    def first_size(data: list[float], target: float) -> int:
        """The length of ``data`` whose sort takes about ``target`` now (from a sort of an eighth
        of it or more: sorting is n log n and slower once the data outgrows the caches)."""
        size = 200_000
        while True:
            started = time.perf_counter()
            sorted(data[:size])
            took = time.perf_counter() - started
            if took >= target / 8 or size >= len(data):
                return max(10_000, min(len(data), int(size * target / max(took, 1e-6))))
            size *= 4

    def _scaled(self, took: float) -> int:
        factor = min(1.5, max(0.67, self.target / max(took, 1e-6)))
        return max(10_000, min(self.MOST, int(self._size * factor)))

    def _hold(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            if self.exact:
                _sleep_holding_gil(self.target)
            else:
                sorted(self._data[:self._size])  # one C call (and a copy): the GIL is not released meanwhile
            took = time.perf_counter() - started
            self.holds.append(took)
            if not self.exact:
                self._size = self._scaled(took)
            if self.pause:
                self._stop.wait(self.pause)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the hold under way (if any) and wait for it."""
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def running(self) -> Iterator[GilHolder]:
        self.start()
        try:
            yield self
        finally:
            self.stop()


def _sleep_holding_gil(seconds: float) -> None:
    libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held for the call
    libc.usleep(ctypes.c_uint(int(seconds * 1_000_000)))


@contextlib.contextmanager
def busy_process(*, gil_hold: float = 0.8, hogs: int = 2, pause: float = 0.0, exact: bool = False) -> Iterator[Holds]:
    """Hold the GIL ``gil_hold`` seconds at a time (``pause`` seconds apart; 0: back to back;
    ``gil_hold=0``: no holder; ``exact``: see :class:`GilHolder`) while ``hogs`` processes spin;
    yields the measured hold durations. The hogs are started and killed here, by their own
    process ids."""
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(hogs)]
    try:
        if gil_hold > 0:
            with GilHolder(gil_hold, pause, exact=exact).running() as holder:
                yield holder.holds
        else:
            yield Holds()
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
