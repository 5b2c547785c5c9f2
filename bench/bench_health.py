"""Time-to-readmit and time-to-mark-down with background health probes, side by side with
the probe settings, on a local 3-replica cluster.

    python bench/bench_health.py [--rounds 5]

* **readmit (under load)**: 4 threads run statements on an ``in_order`` pool; replica r1 is
  killed, then restarted. A separate poller pings r1's ``/ping`` every 5 ms; the figure is the
  time from its first answer to the probe's re-admission event, and to the first statement
  r1 serves again. With probes off, the decay-only wait is shown as the replica's
  ``estimated_recovery_time`` at the moment it answers again (not waited out).
* **mark down (idle)**: the pool is idle after one statement; r1 is killed (refused
  connections), or paused (a hung replica: connections accepted, never answered). The figure
  is the time from the fault to the probe's "down" event, before any statement is sent.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import urllib3

import clickhouse_lb
from clickhouse_lb import ReplicaPool
from clickhouse_lb.config.health import HealthSettings
from clickhouse_lb.core.events import ReplicaDownEvent, ReplicaRecoveredEvent
from clickhouse_lb.testing import LocalCluster

WHO = "SELECT getMacro('replica')"

CONFIGS: dict[str, dict[str, int]] = {
    "default": {},
    "tuned": {
        "health_check_interval_ms": 500,
        "health_check_fast_interval_ms": 50,
        "health_check_timeout_ms": 250,
        "health_check_rise": 1,
    },
    "off": {"health_check_interval_ms": 0},
}


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[float, Any]] = []
        self.cond = threading.Condition()

    def _add(self, event: Any) -> None:
        with self.cond:
            self.seen.append((time.monotonic(), event))
            self.cond.notify_all()

    on_replica_down = _add
    on_replica_recovered = _add

    def first(self, predicate: Callable[[Any], bool], after: float, timeout: float = 60) -> float:
        with self.cond:
            ok = self.cond.wait_for(lambda: any(t >= after and predicate(e) for t, e in self.seen), timeout)
            if not ok:
                raise TimeoutError("event not seen")
            return next(t for t, e in self.seen if t >= after and predicate(e))


@contextmanager
def load(pool: ReplicaPool, threads: int = 4) -> Iterator[list[tuple[float, str]]]:
    served: list[tuple[float, str]] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            served.append((time.monotonic(), str(pool.command(WHO))))

    workers = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    try:
        yield served
    finally:
        stop.set()
        for w in workers:
            w.join()


def first_answer(address: str, stop: threading.Event, found: list[float]) -> None:
    """Ping ``address`` every 5 ms on a connection of its own; note when it first answers."""
    http = urllib3.PoolManager(retries=False)
    while not stop.is_set():
        try:
            r = http.request("GET", f"http://{address}/ping", timeout=urllib3.Timeout(total=0.2))
            if r.status == 200:
                found.append(time.monotonic())
                return
        except Exception:
            pass
        time.sleep(0.005)


def wait(condition: Callable[[], bool], timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.002)
    return time.monotonic()


def readmit_round(cluster: LocalCluster, health: dict[str, int]) -> tuple[float | None, float | None, float]:
    """(answer -> readmit event, answer -> first statement on r1, r1's estimated_recovery_time then)."""
    events = Events()
    r1, name = cluster.hosts[0], cluster.names[0]
    # share_state=False: each round starts from clean counts (not the previous round's state).
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", listeners=[events], share_state=False,
                                **health) as pool, load(pool) as served:
        wait(lambda: len(served) > 20)
        cluster.kill(0)
        wait(lambda: pool.replicas[0].errors_count > 0)
        if health.get("health_check_interval_ms") != 0:
            events.first(lambda e: isinstance(e, ReplicaDownEvent) and e.address == r1, 0)
        stop, found = threading.Event(), []
        poller = threading.Thread(target=first_answer, args=(r1, stop, found))
        poller.start()
        restart_started = time.monotonic()
        cluster.restart(0)
        poller.join(30)
        stop.set()
        answered = found[0] if found else restart_started
        recovery = pool.replicas[0].estimated_recovery_time
        if health.get("health_check_interval_ms") == 0:
            return None, None, recovery
        back = events.first(
            lambda e: isinstance(e, ReplicaRecoveredEvent) and e.address == r1 and e.reason == "probe", answered - 1
        )
        serving = wait(lambda: any(t > answered and who == name for t, who in served))
    return back - answered, serving - answered, recovery


def markdown_round(cluster: LocalCluster, health: dict[str, int], fault: str) -> float:
    events = Events()
    with clickhouse_lb.get_pool(
        cluster.hosts, load_balancing="in_order", listeners=[events], share_state=False, **health
    ) as pool:
        pool.command(WHO)
        wait(lambda: all(r.probe_state == "up" for r in pool.replicas))
        started = time.monotonic()
        (cluster.kill if fault == "kill" else cluster.pause)(0)
        down = events.first(lambda e: isinstance(e, ReplicaDownEvent), started)
    cluster.heal()
    return down - started


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms (max {max(values) * 1000:.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for noisy in ("clickhouse_lb", "clickhouse_connect"):  # failovers and probe failures are the point here
        logging.getLogger(noisy).setLevel(logging.ERROR)
    load_before = os.getloadavg()
    rows = []
    with LocalCluster(replicas=3) as cluster:
        for label, health in CONFIGS.items():
            settings = HealthSettings(**health)
            shown = (
                "off (health_check_interval_ms=0)" if not settings.enabled else
                f"interval {settings.health_check_interval_ms} / fast {settings.health_check_fast_interval_ms}"
                f" / timeout {settings.health_check_timeout_ms} ms, rise {settings.health_check_rise},"
                f" fall {settings.health_check_fall}"
            )
            readmit, serve, recovery, kill_down, pause_down = [], [], [], [], []
            for _ in range(args.rounds):
                a, b, c = readmit_round(cluster, health)
                cluster.heal()
                recovery.append(c)
                if a is not None and b is not None:
                    readmit.append(a)
                    serve.append(b)
                    kill_down.append(markdown_round(cluster, health, "kill"))
                    pause_down.append(markdown_round(cluster, health, "pause"))
            if settings.enabled:
                rows.append((label, shown, fmt(readmit), fmt(serve), fmt(kill_down), fmt(pause_down)))
            else:
                rows.append((label, shown, f"~{statistics.median(recovery):.0f} s (decay only: "
                             "estimated_recovery_time)", "same", "never (until a statement fails there)", "never"))
    load_after = os.getloadavg()
    print(f"| probes | settings | answer -> re-admitted | answer -> serves again | idle kill -> down "
          f"| idle pause -> down |  ({args.rounds} rounds, median (max))")
    print("|---|---|---:|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\nload average before {load_before[0]:.1f}, after {load_after[0]:.1f} (1 min; 2 cores)")


if __name__ == "__main__":
    main()
