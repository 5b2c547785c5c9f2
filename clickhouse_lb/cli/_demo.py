"""``clickhouse-lb demo``: the strategies, a failover and a recovery, on a local cluster.

It starts a :class:`~clickhouse_lb.testing.LocalCluster` (n replica processes running the real
ClickHouse engine through chdb) and runs a workload from a few threads through
:func:`clickhouse_lb.get_pool`; every statement asks who answered (``SELECT getMacro('replica')``).

1. The tour: a few strategies in turn, each through a fresh pool, with the share of the
   statements each replica served.
2. One replica is killed (SIGKILL) mid-run: no statement fails, its ``errors_count`` rises, the
   traffic moves to the others.
3. It is restarted: the pool's health probes see it answer ``/ping`` again and re-admit it (its
   errors would otherwise decay: a short ``distributed_replica_error_half_life`` keeps that
   within the minute too).

On a terminal (and without ``NO_COLOR``) a live table is redrawn in place; otherwise the output
is plain lines. Ctrl-C (or SIGTERM) stops the workload, closes the pool and the cluster, exit 130.
The exit status is 0 only when the run met its claims (see :class:`Claims`).
"""

from __future__ import annotations

import bisect
import os
import signal
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from clickhouse_lb._redact import redact
from clickhouse_lb.cli._console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    format_table,
    short_error,
)
from clickhouse_lb.cli._local import chdb_available, chdb_missing, raise_interrupt, signals, stopping
from clickhouse_lb.config.settings import LoadBalancing
from clickhouse_lb.core.events import ErrorRecordedEvent, FailoverEvent, PoolListener, ReplicaRecoveredEvent
from clickhouse_lb.pools.pool import ReplicaPool, get_pool

__all__ = ["CHDB_MISSING", "Claims", "DemoOptions", "Screen", "Timing", "run_demo"]

CHDB_MISSING = chdb_missing("demo")
WHO = "SELECT getMacro('replica')"
TOUR = (
    LoadBalancing.ROUND_ROBIN,
    LoadBalancing.IN_ORDER,
    LoadBalancing.RANDOM,
    LoadBalancing.NEAREST_HOSTNAME,
    LoadBalancing.FIRST_OR_RANDOM,
)
FAULT_STRATEGY = LoadBalancing.ROUND_ROBIN
STATEMENT_TIMEOUT = 5  # seconds: send_receive_timeout of every replica client
PACE = 0.002  # seconds each client thread pauses between statements, to leave the replicas some CPU
LIVE_REFRESH = 0.2  # seconds between two redraws of the live table
REPLICA_START_GUESS = 3.0  # seconds to start one replica (2 cores, loaded) before one was timed


@dataclass(frozen=True)
class DemoOptions:
    """What ``clickhouse-lb demo`` was asked for."""

    replicas: int = 3
    strategy: LoadBalancing | None = None
    duration: float = 40.0
    threads: int = 3
    verbose: int = 0

    @property
    def tour(self) -> tuple[LoadBalancing, ...]:
        return (self.strategy,) if self.strategy else TOUR

    @property
    def fault_strategy(self) -> LoadBalancing:
        return self.strategy or FAULT_STRATEGY


@dataclass(frozen=True)
class Timing:
    """How long each part runs; everything scales with ``--duration``."""

    half_life: float
    per_strategy: float
    before_kill: float
    after_kill: float
    after_restart: float
    recovery_grace: float
    progress: float
    window: float

    @classmethod
    def scaled(cls, duration: float, strategies: int) -> Timing:
        """Split ``duration`` seconds: ~45% tour, 10% before the kill, 20% after it, 25% after the
        restart. The half-life is short enough for the decay to show: duration/15, in 0.5..4 s."""
        half_life = min(4.0, max(0.5, duration / 15.0))
        return cls(
            half_life=round(half_life, 2),
            per_strategy=min(6.0, max(0.5, duration * 0.45 / strategies)),
            before_kill=max(0.5, duration * 0.10),
            after_kill=max(1.0, duration * 0.20),
            after_restart=max(1.0, duration * 0.25),
            # A returning replica needs bits(errors) half-lives; allow that much more if needed.
            recovery_grace=max(5.0, 6 * half_life),
            progress=max(1.0, duration / 20.0),
            window=max(1.0, min(3.0, duration / 15.0)),
        )


ERRORS_EXPLAINED = (
    "errors_count: failed attempts the pool counted against a replica; it prefers replicas with fewer, and "
    "halves the counts every distributed_replica_error_half_life (as ClickHouse does), so a replica that "
    "failed gets traffic again once its count decays to 0"
)


def estimated_seconds(timing: Timing, strategies: int, replica_start: float) -> float:
    """The run's length: every phase, plus the cluster start and the replica restart
    (``replica_start`` seconds each: a guess before the cluster is up, then as measured). A
    restarted replica usually returns within ``after_restart``; only a slow decay adds time."""
    phases = timing.per_strategy * strategies + timing.before_kill + timing.after_kill + timing.after_restart
    return phases + 2 * replica_start


# -- what the workload and the pool report -----------------------------------------------------


class Tally:
    """Statements served per replica name and failed statements (thread-safe)."""

    def __init__(self, names: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self._served: Counter[str] = Counter(dict.fromkeys(names, 0))
        self.failed = 0
        self.last_failure: str | None = None
        self._phase_starts: list[float] = []  # monotonic start of phase 1, 2, ...
        self._by_phase: list[Counter[str]] = [Counter(dict.fromkeys(names, 0))]

    def served_by(self, name: str, started: float | None = None) -> None:
        """One statement answered by ``name``; it counts in the phase in which it was *sent*
        (``started``, monotonic), so one answered just after a phase mark stays where it began."""
        with self._lock:
            self._served[name] += 1
            phase = len(self._phase_starts) if started is None else bisect.bisect_right(self._phase_starts, started)
            self._by_phase[phase][name] += 1

    def next_phase(self) -> None:
        """Statements sent from now on count in a new phase."""
        with self._lock:
            self._phase_starts.append(time.monotonic())
            self._by_phase.append(Counter(dict.fromkeys(self._served, 0)))

    def phases(self) -> list[Counter[str]]:
        """Statements served per replica in each phase, in order."""
        with self._lock:
            return [Counter(c) for c in self._by_phase]

    def failure(self, exc: BaseException) -> None:
        with self._lock:
            self.failed += 1
            self.last_failure = redact(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}")

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self._served)

    @property
    def statements(self) -> int:
        with self._lock:
            return sum(self._served.values()) + self.failed


class Workload:
    """Client threads running ``WHO`` through a pool until stopped, tallying who answered."""

    def __init__(self, pool: ReplicaPool, tally: Tally, threads: int) -> None:
        self._pool = pool
        self.tally = tally
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name=f"clickhouse-lb-demo-{i}", daemon=True) for i in range(threads)
        ]

    def start(self) -> Workload:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                started = time.monotonic()
                self.tally.served_by(str(self._pool.command(WHO)), started)
            except Exception as exc:
                if self._stop.is_set():
                    return  # stopping (Ctrl-C may have stopped the replicas too): not a failure
                self.tally.failure(exc)
            self._stop.wait(PACE)

    def stop(self) -> None:
        """Stop the threads; each finishes its statement (bounded by the statement timeout)."""
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=STATEMENT_TIMEOUT * 3 + 1)


class EventLog(PoolListener):
    """The pool's events (the listener hook an application would use for metrics)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.errors_recorded: Counter[str] = Counter()
        self.failovers = 0
        self._pending: deque[FailoverEvent | ReplicaRecoveredEvent] = deque()

    def on_error_recorded(self, event: ErrorRecordedEvent) -> None:
        with self._lock:
            self.errors_recorded[event.address] += 1

    def on_failover(self, event: FailoverEvent) -> None:
        with self._lock:
            self.failovers += 1
            self._pending.append(event)

    def on_replica_recovered(self, event: ReplicaRecoveredEvent) -> None:
        with self._lock:
            self._pending.append(event)

    def drain(self) -> list[FailoverEvent | ReplicaRecoveredEvent]:
        with self._lock:
            events = list(self._pending)
            self._pending.clear()
        return events


class RecentShare:
    """Each replica's share of the statements over the last ``window`` seconds."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._samples: deque[tuple[float, Counter[str]]] = deque()

    def add(self, now: float, served: Counter[str]) -> dict[str, float]:
        self._samples.append((now, served))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window:
            self._samples.popleft()
        return shares(served - self._samples[0][1], list(served))


def shares(served: Mapping[str, int], names: Sequence[str]) -> dict[str, float]:
    """Fraction of ``served`` per name (0 for all when nothing was served)."""
    total = sum(served.get(n, 0) for n in names)
    return {n: (served.get(n, 0) / total if total else 0.0) for n in names}


@dataclass
class Claims:
    """What the run set out to show; the exit status is 0 only when every one holds."""

    failed: int = 0
    victim: str | None = None
    victim_errors: int = 0
    victim_served_while_down: int | None = None
    others_served_while_down: int = 0
    returned_after: float | None = None
    notes: list[str] = field(default_factory=list)
    #: Statements each replica served in part 2-3: before the kill, while the victim was down
    #: (from the kill to its restart), after the restart.
    phases: dict[str, Counter[str]] = field(default_factory=dict)
    #: Errors counted per replica name over part 2-3 (the live table's "errors recorded").
    errors_recorded: Counter[str] = field(default_factory=Counter)
    failovers: int = 0

    def checks(self) -> list[tuple[str, bool]]:
        name = self.victim or "the killed replica"
        return [
            ("no statement failed (one replica down at most)", self.failed == 0),
            (f"{name}'s errors rose while it was down ({self.victim_errors} recorded)", self.victim_errors > 0),
            (
                f"traffic moved: {name} served {self.victim_served_while_down} while down, "
                f"the others {self.others_served_while_down}",
                self.victim_served_while_down == 0 and self.others_served_while_down > 0,
            ),
            (
                f"{name} back in rotation"
                + (f" ({self.returned_after:.1f} s after the restart)" if self.returned_after is not None else ""),
                self.returned_after is not None,
            ),
        ]

    @property
    def met(self) -> bool:
        return all(ok for _, ok in self.checks())


# -- output ------------------------------------------------------------------------------------


class Screen:
    """Lines on ``out``; on a terminal also a live area redrawn in place (ANSI cursor moves)."""

    _GREEN, _RED, _BOLD, _RESET = "\x1b[32m", "\x1b[31m", "\x1b[1m", "\x1b[0m"

    def __init__(self, out: TextIO, *, live: bool) -> None:
        self.out = out
        self.live = live
        self._drawn: list[str] = []

    @classmethod
    def for_stream(cls, out: TextIO, *, force_plain: bool = False, environ: Mapping[str, str] = os.environ) -> Screen:
        """Live when ``out`` is a terminal, ``NO_COLOR`` is unset and ``TERM`` is not dumb."""
        isatty = getattr(out, "isatty", None)
        tty = bool(isatty and isatty())
        live = tty and not force_plain and not environ.get("NO_COLOR") and environ.get("TERM") != "dumb"
        return cls(out, live=live)

    def paint(self, text: str, style: str) -> str:
        """Colour (``good``, ``bad``, ``bold``) on a live screen; the text unchanged otherwise."""
        if not self.live:
            return text
        code = {"good": self._GREEN, "bad": self._RED, "bold": self._BOLD}[style]
        return f"{code}{text}{self._RESET}"

    def line(self, text: str = "") -> None:
        """A permanent line (above the live area, which is redrawn below it)."""
        drawn = self._drawn
        self._erase()
        self.out.write(text + "\n")
        self._draw(drawn)

    def show(self, lines: Sequence[str]) -> None:
        """Replace the live area (a no-op on a plain screen)."""
        if self.live:
            self._erase()
            self._draw(list(lines))

    def clear(self) -> None:
        """Remove the live area."""
        self._erase()
        self.out.flush()

    def _erase(self) -> None:
        if self._drawn:
            self.out.write(f"\x1b[{len(self._drawn)}F\x1b[J")
            self._drawn = []

    def _draw(self, lines: list[str]) -> None:
        if lines:
            self.out.write("".join(line + "\n" for line in lines))
        self._drawn = lines
        self.out.flush()


# -- the run -----------------------------------------------------------------------------------


DESCRIPTIONS = {
    LoadBalancing.ROUND_ROBIN: "rotation: each replica with the fewest errors gets an equal share",
    LoadBalancing.IN_ORDER: "the first replica of the list while it has no more errors than the others",
    LoadBalancing.RANDOM: "uniformly random among the replicas with the fewest errors",
    LoadBalancing.NEAREST_HOSTNAME: "the host name nearest to local_hostname={local}",
    LoadBalancing.HOSTNAME_LEVENSHTEIN_DISTANCE: "the smallest edit distance to local_hostname={local}",
    LoadBalancing.HOSTNAME_LONGEST_COMMON_PREFIX: "the longest common prefix with local_hostname={local}",
    LoadBalancing.HOSTNAME_LONGEST_COMMON_SUFFIX: "the longest common suffix with local_hostname={local}",
    LoadBalancing.FIRST_OR_RANDOM: "the replica at load_balancing_first_offset={offset} ({preferred})",
    LoadBalancing.LEAST_LOADED: "the less loaded of two random replicas (in flight x latency; our extension)",
}


class Demo:
    """The three parts of the demo over one started cluster (see the module docstring)."""

    def __init__(self, cluster: Any, options: DemoOptions, timing: Timing, screen: Screen) -> None:
        self.cluster = cluster
        self.options = options
        self.timing = timing
        self.screen = screen
        self.names: list[str] = list(cluster.names)
        self.addresses: list[str] = list(cluster.hosts)
        self.name_of = dict(zip(self.addresses, self.names))
        self.total: Counter[str] = Counter(dict.fromkeys(self.names, 0))
        self.failed = 0
        self.failovers = 0
        self.claims = Claims()
        self._pool: ReplicaPool | None = None
        self._workload: Workload | None = None
        self._events = EventLog()
        self._started = time.monotonic()
        self._shown: set[tuple[str, str]] = set()
        self._phase = ""

    # -- pools and workloads -------------------------------------------------------------------

    def strategy_options(self, strategy: LoadBalancing) -> dict[str, Any]:
        """Extra settings that make a strategy visible: a local host name, a first offset."""
        if strategy.uses_hostnames:
            return {"local_hostname": self.cluster.address(min(1, len(self.names) - 1))[0]}
        if strategy is LoadBalancing.FIRST_OR_RANDOM:
            return {"load_balancing_first_offset": 1}
        return {}

    def describe(self, strategy: LoadBalancing) -> str:
        options = self.strategy_options(strategy)
        offset = options.get("load_balancing_first_offset", 0)
        return DESCRIPTIONS[strategy].format(
            local=options.get("local_hostname"), offset=offset, preferred=self.names[offset % len(self.names)]
        )

    def _begin(self, strategy: LoadBalancing) -> Tally:
        self._finish()
        self._events = EventLog()
        self._pool = get_pool(
            self.addresses,
            load_balancing=strategy,
            distributed_replica_error_half_life=self.timing.half_life,
            send_receive_timeout=STATEMENT_TIMEOUT,
            listeners=[self._events],
            connect_on_create=False,  # the workload's own statements count every failure
            **self.strategy_options(strategy),
        )
        tally = Tally(self.names)
        self._workload = Workload(self._pool, tally, self.options.threads).start()
        return tally

    def _finish(self) -> None:
        """Stop the workload, add its counts to the totals, close its pool."""
        workload, self._workload = self._workload, None
        if workload is not None:
            workload.stop()
            self.total.update(workload.tally.snapshot())
            self.failed += workload.tally.failed
            self.failovers += self._events.failovers
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def shutdown(self) -> None:
        """Stop everything this object started (the cluster is the caller's)."""
        self._finish()
        self.screen.clear()

    # -- display -------------------------------------------------------------------------------

    def elapsed(self) -> str:
        return f"+{time.monotonic() - self._started:.1f} s".rjust(8)

    def event(self, text: str) -> None:
        self.screen.line(f"  {self.elapsed()}  {text}")

    def _replica_rows(self, tally: Tally, share: Mapping[str, float]) -> list[tuple[str, ...]]:
        assert self._pool is not None
        served = tally.snapshot()
        rows: list[tuple[str, ...]] = []
        for i, status in enumerate(self._pool.replicas):
            name = self.names[i]
            alive = self.cluster.is_alive(i)
            rows.append((
                name,
                status.address,
                self.screen.paint("up  ", "good") if alive else self.screen.paint("DOWN", "bad"),
                str(served[name]),
                f"{share.get(name, 0.0):4.0%}",
                str(status.errors_count),
                f"{status.estimated_recovery_time:4.1f} s" if status.estimated_recovery_time else "-",
                str(self._events.errors_recorded[status.address]),
            ))
        return rows

    def live_table(self, label: str, tally: Tally, share: Mapping[str, float]) -> list[str]:
        header = ("replica", "address", "process", "served", f"share (last {self.timing.window:.0f} s)",
                  "errors_count", "recovers in", "errors recorded")
        failed = self.screen.paint(str(tally.failed), "bad" if tally.failed else "good")
        return [
            *format_table(header, self._replica_rows(tally, share), indent="    "),
            f"    {label}  {self.elapsed()}  statements {tally.statements}  failed {failed}  "
            f"failovers {self._events.failovers}",
        ]

    def progress_line(self, tally: Tally, share: Mapping[str, float]) -> str:
        assert self._pool is not None
        statuses = self._pool.replicas
        parts = [
            "share " + " ".join(f"{n} {share.get(n, 0.0):.0%}" for n in self.names),
            "errors_count " + " ".join(f"{n}={s.errors_count}" for n, s in zip(self.names, statuses)),
        ]
        recovering = [f"{n} in {s.estimated_recovery_time:.1f} s" for n, s in zip(self.names, statuses)
                      if s.estimated_recovery_time > 0]
        if recovering:
            parts.append("recovery " + ", ".join(recovering))
        parts.append(f"statements {tally.statements}, failed {tally.failed}")
        return " | ".join(parts)

    def _announce(self, item: FailoverEvent | ReplicaRecoveredEvent) -> None:
        """Print the first failover of each replica per phase, and the first recovery per phase."""
        name = self.name_of.get(item.address, item.address)
        if isinstance(item, FailoverEvent):
            key = ("failover", item.address)
            text = (f"failover: a {item.operation} on {name} failed ({short_error(item.error)}); it went on to "
                    f"{self.name_of.get(item.next_address, item.next_address)}, nothing failed "
                    "(further failovers are only counted)")
        elif self.claims.victim == name and self._phase == "down":
            key = ("recovered", item.address)
            text = f"{name}: its errors decayed to 0; the pool will try it again (and count another error)"
        elif item.reason == "succeeded":
            key = ("recovered", item.address)
            text = f"{name} back in rotation: a statement succeeded on it (a ReplicaRecoveredEvent)"
        else:
            return  # a decay seen during the restart says nothing about the replica being back
        if key not in self._shown:
            self._shown.add(key)
            self.event(text)

    def watch(
        self, seconds: float, tally: Tally, label: str, *,
        progress: bool = True, until: Callable[[], bool] | None = None, grace: float = 0.0,
    ) -> bool:
        """Let the workload run for ``seconds`` (then up to ``grace`` more until ``until()``),
        refreshing the display. Returns ``until()`` (True without one)."""
        start = time.monotonic()
        deadline, hard_deadline = start + seconds, start + seconds + grace
        recent = RecentShare(self.timing.window)
        next_progress = start + self.timing.progress
        while True:
            now = time.monotonic()
            for item in self._events.drain():
                self._announce(item)
            share = recent.add(now, tally.snapshot())
            if self.screen.live:
                self.screen.show(self.live_table(label, tally, share))
            elif progress and now >= next_progress:
                self.screen.line(f"  {self.elapsed()}  {self.progress_line(tally, share)}")
                next_progress += self.timing.progress
            done = until() if until is not None else True
            if now >= deadline and (done or now >= hard_deadline):
                return done
            time.sleep(LIVE_REFRESH if self.screen.live else 0.05)

    # -- the parts -----------------------------------------------------------------------------

    def run(self) -> Claims:
        self.tour()
        self.fault()
        self._finish()
        self.screen.clear()
        self.claims.failed = self.failed
        self.summary()
        return self.claims

    def tour(self) -> None:
        strategies = self.options.tour
        self.screen.line()
        self.screen.line(self.screen.paint(
            f"1. The strategies, {self.timing.per_strategy:.1f} s each: the share of the statements each replica "
            "served", "bold"))
        for strategy in strategies:
            tally = self._begin(strategy)
            self._phase = strategy.value
            self.watch(self.timing.per_strategy, tally, strategy.value, progress=False)
            self.screen.clear()
            served = tally.snapshot()
            share = shares(served, self.names)
            cells = "  ".join(f"{n} {share[n]:4.0%}" for n in self.names)
            self.screen.line(
                f"  {strategy.value:<17} {cells}   {tally.statements} statements, {tally.failed} failed: "
                f"{self.describe(strategy)}"
            )

    def fault(self) -> None:
        strategy = self.options.fault_strategy
        self.screen.line()
        self.screen.line(self.screen.paint(f"2. {strategy.value}: a replica is killed mid-run", "bold"))
        tally = self._begin(strategy)
        self._phase = "before"
        self.watch(self.timing.before_kill, tally, "before the kill")
        victim = self.victim()
        name = self.names[victim]
        self.claims.victim = name
        self.cluster.kill(victim)  # returns once the process is gone
        tally.next_phase()  # no statement sent from now on can be answered by the victim
        self._phase = "down"
        self.event(f"killed {name} ({self.addresses[victim]}) with SIGKILL: it refuses connections from now on")
        self.watch(self.timing.after_kill, tally, f"{name} down")
        self.restart(victim, tally)  # starts the third phase as it restarts the victim
        before, down, after = tally.phases()
        self.claims.victim_served_while_down = down[name]
        self.claims.others_served_while_down = sum(v for k, v in down.items() if k != name)
        # The summary's numbers are this pool's (the tour's pools are not counted), the same
        # counters the live table showed: they agree by construction.
        self.claims.phases = {
            "sent before the kill": before,
            f"sent while {name} was down": down,
            "sent from the restart on": after,
        }
        self.claims.errors_recorded = Counter(
            {self.name_of[a]: n for a, n in self._events.errors_recorded.items() if a in self.name_of}
        )
        self.claims.victim_errors = self.claims.errors_recorded[name]
        self.claims.failovers = self._events.failovers

    def restart(self, victim: int, tally: Tally) -> None:
        name = self.names[victim]
        self.screen.line()
        self.screen.line(self.screen.paint(
            f"3. {name} restarted: back in rotation once the health probes see it answer, or its errors "
            f"decay (distributed_replica_error_half_life={self.timing.half_life:g} s)", "bold"))
        self.event(f"restarting {name} ...")
        tally.next_phase()
        self.cluster.restart(victim)
        self._phase = "restarted"
        self._shown.discard(("recovered", self.addresses[victim]))
        restarted = time.monotonic()
        assert self._pool is not None
        status = self._pool.replicas[victim]
        self.event(f"restarted {name} (same address, same data); errors_count {status.errors_count}, "
                   f"recovers in {status.estimated_recovery_time:.1f} s")
        before = tally.snapshot()[name]
        returned: list[float] = []

        def back() -> bool:
            if not returned and tally.snapshot()[name] > before:
                returned.append(time.monotonic() - restarted)
                self.event(f"{name} served a statement again, {returned[0]:.1f} s after the restart")
            return bool(returned)

        self.watch(self.timing.after_restart, tally, f"{name} restarted", until=back, grace=self.timing.recovery_grace)
        self.claims.returned_after = returned[0] if returned else None

    def victim(self) -> int:
        """The replica the next statement would go to: killing it makes the traffic move."""
        assert self._pool is not None
        return self.addresses.index(self._pool.plan()[0])

    def summary(self) -> None:
        strategy = self.options.fault_strategy.value
        claims = self.claims
        self.screen.line()
        self.screen.line(self.screen.paint(
            f"Summary of parts 2 and 3 ({strategy}, one pool; the strategy tour is not counted)", "bold"))
        header = ("replica", "address", *(f"served, {label}" for label in claims.phases), "errors recorded")
        rows = [
            (n, a, *(str(counts[n]) for counts in claims.phases.values()), str(claims.errors_recorded[n]))
            for n, a in zip(self.names, self.addresses)
        ]
        for line in format_table(header, rows, indent="  "):
            self.screen.line(line)
        statements = sum(sum(c.values()) for c in claims.phases.values()) + claims.failed
        self.screen.line(
            f"  statements {statements}, failed {claims.failed}, failovers {claims.failovers} "
            "(a failover: an attempt failed on one replica and the statement went on to another)"
        )
        self.screen.line(
            "  served: statements answered by the replica, each counted in the phase it was sent in; "
            "errors recorded: every failed attempt counted against the replica (the live table's column), "
            "from which its errors_count decays"
        )
        for text, ok in claims.checks():
            mark = self.screen.paint("yes", "good") if ok else self.screen.paint("NO ", "bad")
            self.screen.line(f"  [{mark}] {text}")


# -- entry point -------------------------------------------------------------------------------


def run_demo(options: DemoOptions, out: TextIO | None = None) -> int:
    """Run the demo; 0 when it met its claims, 1 when not, 2 without chdb, 130 on Ctrl-C."""
    out = out or sys.stdout
    if not chdb_available():
        print(CHDB_MISSING, file=sys.stderr)
        return EXIT_USAGE
    from clickhouse_lb.testing import ClusterError, LocalCluster

    screen = Screen.for_stream(out, force_plain=options.verbose > 0)
    timing = Timing.scaled(options.duration, len(options.tour))
    cluster = LocalCluster(replicas=options.replicas)
    demo: Demo | None = None
    with signals({signal.SIGTERM: raise_interrupt}):
        try:
            start_cluster(cluster, options, timing, screen)
            demo = Demo(cluster, options, timing, screen)
            return EXIT_OK if demo.run().met else EXIT_FAILED
        except KeyboardInterrupt:
            screen.clear()
            screen.line("interrupted: stopping the workload, closing the pool and the cluster")
            return EXIT_INTERRUPTED
        except ClusterError as exc:
            screen.clear()
            screen.line(f"the local cluster failed: {redact(str(exc))}")
            return EXIT_FAILED
        finally:
            with stopping():
                if demo is not None:
                    demo.shutdown()
                cluster.close()


def start_cluster(cluster: Any, options: DemoOptions, timing: Timing, screen: Screen) -> None:
    """Start the cluster and say what is about to happen."""
    screen.line(
        f"clickhouse-lb demo: {options.replicas} local replicas (the real ClickHouse engine, via chdb), "
        f"{options.threads} client threads"
    )
    strategies = len(options.tour)
    screen.line(
        f"takes about {estimated_seconds(timing, strategies, REPLICA_START_GUESS):.0f} s: starting the cluster, "
        f"{strategies} strateg{'y' if strategies == 1 else 'ies'} for {timing.per_strategy:.1f} s each, "
        "then a replica killed and restarted"
    )
    screen.line("starting the cluster ...")
    started = time.monotonic()
    cluster.start()
    took = time.monotonic() - started
    remaining = estimated_seconds(timing, strategies, took) - took
    screen.line(f"cluster up in {took:.1f} s (about {remaining:.0f} s to go):")
    for name, host in zip(cluster.names, cluster.hosts):
        screen.line(f"  {name}  {host}")
    screen.line(f"each statement asks who answered: {WHO}")
    screen.line(ERRORS_EXPLAINED)
    screen.line(
        f"distributed_replica_error_half_life={timing.half_life:g} s here (60 s by default; short, so that the "
        "decay shows); Ctrl-C stops cleanly"
    )
