"""What is measured, as data (:data:`SCENARIOS`), and how each kind of scenario runs.

A scenario names its kind (``latency``, ``timeline``, ``spread``, ``slow``), its contenders
and its parameters. An HAProxy contender in a run without haproxy is listed as not run, with
the reason, never faked.

The failover scenarios run the pool with its defaults (health probes re-admit a revived
replica, liveness-checked waits leave a hung one) next to ``pool_random_no_checks``, the same
pool with both turned off (what it did before them), so that the timelines show what each buys;
the hung-replica scenario also runs hedged reads.
"""

from __future__ import annotations

import functools
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .analysis import (
    error_kinds,
    failed_count,
    latency_quantiles,
    replica_shares,
    summarize_timeline,
)
from .contenders import Contender, Target, available, by_name, open_scrambler, open_target, pool_arguments
from .load import Outcome, pack_outcome, run_count, run_until
from .report import readmit_text

__all__ = ["SCENARIOS", "Bench", "Scenario", "Sizes"]

SELECT_1 = "SELECT 1"
#: A mid-size result: 20,000 rows of two columns (about 300 KB on the wire, parsed by the client).
MID_QUERY = "SELECT number, toString(number) AS s FROM system.numbers LIMIT 20000"
#: Which replica answered (the local cluster sets the ``replica`` macro): works through HAProxy too.
WHO = "SELECT getMacro('replica')"

LATENCY_CONTENDERS = ("bare", "bare_random", "bare_round_robin", "pool_in_order", "pool_random",
                      "pool_round_robin", "pool_least_loaded", "haproxy_default", "haproxy_tuned")
#: A killed replica: refused connections fail over at once whatever the settings, so what differs
#: is the re-admission after the restart (probes against the error decay) and HAProxy's checks.
KILL_CONTENDERS = ("pool_random", "pool_random_no_checks", "haproxy_default", "haproxy_tuned")
#: A hung replica: liveness-checked waits and hedged reads against a wait for the socket timeout.
PAUSE_CONTENDERS = ("pool_random", "pool_random_no_checks", "pool_hedged", "haproxy_default", "haproxy_tuned")


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str
    title: str
    contenders: tuple[str, ...]
    fault: str | None = None  # timeline: "kill" (then restart) or "pause" (then resume)
    params: dict[str, Any] = field(default_factory=dict)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("latency", "latency", "Per-statement cost: SELECT 1 and a 20,000-row query, 1 and 8 threads",
             LATENCY_CONTENDERS),
    Scenario("kill_restart", "timeline", "Replica r1 SIGKILLed under 4 threads of reads, then restarted",
             KILL_CONTENDERS, fault="kill"),
    Scenario("pause_resume", "timeline", "Replica r1 SIGSTOPped (hung) under 4 threads of reads, then resumed",
             PAUSE_CONTENDERS, fault="pause"),
    Scenario("spread_one_down", "spread", "Load spread with replica r1 down (4 threads)",
             ("pool_in_order", "pool_first_or_random", "pool_random", "pool_round_robin", "haproxy_tuned")),
    Scenario("one_slow_replica", "slow", "One slow replica: r1 answers 50 ms late (8 threads)",
             ("pool_random", "pool_round_robin", "pool_least_loaded", "pool_hedged", "haproxy_tuned",
              "haproxy_leastconn"),
             params={"delay": 0.05}),
)

@dataclass(frozen=True)
class Sizes:
    """How long and how much: ``quick`` is about 3 minutes on 2 shared cores, ``full`` about 10-13
    (most of it the latency rounds; a failover run lasts fault_at + the fault + observe)."""

    rounds: int
    per_cell: dict[tuple[str, int], int]  # (query, threads) -> statements per round
    fault_at: float
    kill_for: float
    pause_for: float
    observe: float
    timeline_threads: int
    repeats: int
    own_time_statements: int
    spread_seconds: float
    slow_seconds: float

    @staticmethod
    def quick() -> Sizes:
        return Sizes(rounds=6, per_cell={("select1", 1): 25, ("mid", 1): 8, ("select1", 8): 96, ("mid", 8): 32},
                     fault_at=1.0, kill_for=1.5, pause_for=2.0, observe=4.0, timeline_threads=4, repeats=1,
                     own_time_statements=400, spread_seconds=2.0, slow_seconds=2.5)

    @staticmethod
    def full() -> Sizes:
        return Sizes(rounds=16, per_cell={("select1", 1): 60, ("mid", 1): 16, ("select1", 8): 200, ("mid", 8): 64},
                     fault_at=2.0, kill_for=3.0, pause_for=5.0, observe=6.0, timeline_threads=4, repeats=2,
                     own_time_statements=2000, spread_seconds=4.0, slow_seconds=5.0)


QUERIES = {"select1": SELECT_1, "mid": MID_QUERY}


class Bench:
    """The running cluster (and HAProxy), the sizes, and a log for progress lines."""

    def __init__(self, cluster: Any, haproxy: Any | None, sizes: Sizes, log: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.haproxy = haproxy
        self.sizes = sizes
        self.log = log
        self.addresses: list[str] = list(cluster.hosts)
        self.rng = random.Random()  # the 1-thread turn orders and scrambling picks
        self.replicas: list[str] = list(cluster.names)

    def runnable(self, names: Sequence[str]) -> tuple[list[Contender], dict[str, str]]:
        run, skipped = [], {}
        for name in names:
            c = by_name(name)
            why = available(c, self.haproxy is not None)
            if why is None:
                run.append(c)
            else:
                skipped[name] = why
        return run, skipped

    def open(self, c: Contender, warm: int = 20, sql: str = WHO) -> Target:
        target = open_target(c, self.addresses, self.haproxy)
        for _ in range(warm):  # connections, server caches; the pool's clients are made on first use
            target.query(sql)
        return target

    def run(self, scenario: Scenario) -> dict[str, Any]:
        run, skipped = self.runnable(scenario.contenders)
        self.log(f"== {scenario.name}: {scenario.title} ({len(run)} contenders"
                 + (f"; not run: {', '.join(skipped)}" if skipped else "") + ")")
        runner = {"latency": self._latency, "timeline": self._timeline, "spread": self._spread,
                  "slow": self._slow}[scenario.kind]
        started = time.perf_counter()
        result = runner(scenario, run)
        return {"name": scenario.name, "kind": scenario.kind, "title": scenario.title, "fault": scenario.fault,
                "params": scenario.params, "contenders": {c.name: c.description for c in run},
                "not_run": skipped, "seconds": time.perf_counter() - started, **result}

    # -- latency: interleaved rounds ---------------------------------------------------------

    def _latency(self, scenario: Scenario, run: list[Contender]) -> dict[str, Any]:
        targets = {c.name: self.open(c, warm=30, sql=SELECT_1) for c in run}
        # One bare client per replica, to run an unmeasured SELECT 1 on a random replica before
        # each measured 1-thread statement (see _interleaved_medians); on connections of their own.
        scramblers = [open_scrambler(address) for address in self.addresses]
        cells = list(self.sizes.per_cell)
        # seconds per statement: the median latency with 1 thread, wall time / statements with more
        values: dict[str, dict[str, list[float]]] = {f"{q}/{t}": {c.name: [] for c in run} for q, t in cells}
        try:
            for target in targets.values():
                target.query(MID_QUERY)
            for r in range(self.sizes.rounds):
                order = run[r % len(run):] + run[:r % len(run)]  # rotate, so no contender always goes first
                if r % 2:
                    order.reverse()
                for (q, t), total in self.sizes.per_cell.items():
                    if t == 1:  # one statement of each contender in turn: a noise burst hits them all
                        medians = _interleaved_medians(targets, order, QUERIES[q], total, rng=self.rng,
                                                       scramblers=scramblers)
                        for name, per_statement in medians.items():
                            values[f"{q}/{t}"][name].append(per_statement)
                        continue
                    for c in order:
                        outcomes, wall = run_count(targets[c.name].query, QUERIES[q], t, total)
                        if any(not o.ok for o in outcomes):
                            raise RuntimeError(f"{c.name}: {error_kinds(outcomes)} on a healthy cluster")
                        values[f"{q}/{t}"][c.name].append(wall / len(outcomes))
                self.log(f"   round {r + 1}/{self.sizes.rounds} done")
            strategies = [c.strategy for c in run if c.kind == "pool" and c.strategy and not c.options]
            own = pool_own_time_us(self.addresses, strategies, scramblers, self.sizes.own_time_statements)
        finally:
            for target in [*targets.values(), *scramblers]:
                target.close()
        return {"cells": [f"{q}/{t}" for q, t in cells], "values": values,
                "controls": {c.name: c.control for c in run}, "python_work_us": pool_python_work_us(strategies),
                "own_time_us": own}

    # -- failover timeline -------------------------------------------------------------------

    def _timeline(self, scenario: Scenario, run: list[Contender]) -> dict[str, Any]:
        s = self.sizes
        runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in run}
        for rep in range(s.repeats):
            order = run if rep % 2 == 0 else list(reversed(run))
            for c in order:
                runs[c.name].append(self._one_timeline(scenario, c))
        return {"runs": runs, "replicas": self.replicas, "threads": s.timeline_threads}

    def _one_timeline(self, scenario: Scenario, c: Contender) -> dict[str, Any]:
        s, cluster = self.sizes, self.cluster
        target = self.open(c)
        stop = threading.Event()
        t0 = time.perf_counter()
        join = run_until(target.query, WHO, s.timeline_threads, t0, stop)
        events: dict[str, float] = {}
        try:
            _sleep_until(t0 + s.fault_at)
            if scenario.fault == "kill":
                cluster.kill(0)
                events["fault"] = time.perf_counter() - t0
                _sleep_until(t0 + s.fault_at + s.kill_for)
                events["recover"] = time.perf_counter() - t0
                cluster.restart(0)  # returns when the new process answers /ping
            else:
                cluster.pause(0)
                events["fault"] = time.perf_counter() - t0
                _sleep_until(t0 + s.fault_at + s.pause_for)
                events["recover"] = time.perf_counter() - t0
                cluster.resume(0)
            events["back"] = time.perf_counter() - t0
            _sleep_until(t0 + events["back"] + s.observe)
            events["end"] = time.perf_counter() - t0
        finally:
            stop.set()
            outcomes = join()
            target.close()
            cluster.heal()
        summary = summarize_timeline(outcomes, events, scenario.fault or "", self.replicas[0])
        rotation = readmit_text(summary)
        if not summary["never_left"]:
            rotation = f"back in rotation {rotation}"
        self.log(f"   {c.name}: {summary['statements']} ok, {summary['failed']} failed, worst gap "
                 f"{summary['worst_gap']:.2f}s, r1 {rotation}"
                 + (f", {summary['stuck']} stuck on r1" if summary["stuck"] else ""))
        return {"events": events, "outcomes": [pack_outcome(o) for o in outcomes], "summary": summary}

    # -- spread with one replica down ----------------------------------------------------------

    def _spread(self, scenario: Scenario, run: list[Contender]) -> dict[str, Any]:
        s = self.sizes
        result: dict[str, Any] = {}
        self.cluster.kill(0)
        try:
            for c in run:
                target = self.open(c, warm=30)  # the first statements find r1 down and count it
                try:
                    outcomes = _for_seconds(target, WHO, s.timeline_threads, s.spread_seconds)
                finally:
                    target.close()
                result[c.name] = {"shares": replica_shares(outcomes, self.replicas),
                                  "statements": sum(1 for o in outcomes if o.ok), "failed": failed_count(outcomes),
                                  **latency_quantiles(outcomes)}
                shares = " ".join(f"{k}={v:.0%}" for k, v in result[c.name]["shares"].items())
                self.log(f"   {c.name}: {shares}")
        finally:
            self.cluster.heal()
        return {"results": result, "replicas": self.replicas, "threads": s.timeline_threads,
                "seconds_each": s.spread_seconds}

    # -- one slow replica ------------------------------------------------------------------

    def _slow(self, scenario: Scenario, run: list[Contender]) -> dict[str, Any]:
        s = self.sizes
        delay = float(scenario.params.get("delay", 0.05))
        threads = 8
        result: dict[str, Any] = {}
        self.cluster.set_delay(0, delay)
        try:
            for c in run:
                target = self.open(c, warm=10)
                try:
                    outcomes = _for_seconds(target, WHO, threads, s.slow_seconds)
                finally:
                    target.close()
                ok = sum(1 for o in outcomes if o.ok)
                result[c.name] = {"shares": replica_shares(outcomes, self.replicas), "statements": ok,
                                  "throughput": ok / s.slow_seconds, "failed": failed_count(outcomes),
                                  **latency_quantiles(outcomes)}
                r = result[c.name]
                self.log(f"   {c.name}: {r['throughput']:.0f}/s p99 {r['p99'] * 1e3:.0f} ms, "
                         f"r1 share {r['shares'][self.replicas[0]]:.0%}")
        finally:
            self.cluster.heal()
        return {"results": result, "replicas": self.replicas, "threads": threads, "delay": delay,
                "seconds_each": s.slow_seconds}


class _TimedClient:
    """A clickhouse-connect client that records how long each ``query`` took inside it, the
    reading of its result included.

    clickhouse-connect's sync ``query`` returns before it parses the response: the rows are read
    when ``result_rows`` is first touched, by whoever touches it. The pool touches it inside the
    attempt (so that a response cut mid-body fails over, and nothing unread is left to the
    garbage collector); a bare client's caller touches it later. Timing the client's call alone
    charged that parsing to the pool as its "own" work while the bare floor never paid it (the
    figures before 2026-12-01's third stop were measured so): parsing the answer is the client's
    work whoever triggers it, so it is timed inside here, for both."""

    def __init__(self, client: Any, inside: list[float]) -> None:
        self._client = client
        self._inside = inside

    def query(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            result = self._client.query(*args, **kwargs)
            _ = result.result_set  # (read once and kept: the pool's own read finds it done)
            return result
        finally:
            self._inside.append(time.perf_counter() - start)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def pool_own_time_us(addresses: Sequence[str], strategies: Sequence[str], scramblers: Sequence[Target],
                     n: int) -> dict[str, float]:
    """The pool's own time per statement in the real mix: each statement's time minus the time
    spent inside its replica's client, median over ``n`` statements, per strategy; ``floor`` is
    the same measure for a call that only passes through to a bare client (the measuring's own
    cost). Between statements the CPU runs the replicas, so this is the pool's work with cold
    caches, unlike the hot loop of :func:`pool_python_work_us`."""
    import clickhouse_connect

    from clickhouse_lb import ReplicaPool, get_pool

    from .contenders import CLIENT_OPTIONS

    rng = random.Random(n)
    out: dict[str, float] = {}

    def measure(call: Callable[[], Any], inside: list[float]) -> float:
        for _ in range(30):
            call()
        inside.clear()
        outside = []
        for _ in range(n):
            if scramblers:
                scramblers[rng.randrange(len(scramblers))].query(SELECT_1)
            start = time.perf_counter()
            call()
            outside.append(time.perf_counter() - start)
        return statistics.median(o - i for o, i in zip(outside, inside)) * 1e6

    for strategy in strategies:
        inside: list[float] = []
        config = get_pool(list(addresses), connect_on_create=False, **pool_arguments(strategy, {})).config

        def timed_factory(inside: list[float] = inside, **options: Any) -> Any:
            return _TimedClient(clickhouse_connect.get_client(**options), inside)

        pool = ReplicaPool(config, client_factory=timed_factory)
        try:
            out[strategy] = measure(functools.partial(pool.query, SELECT_1), inside)
        finally:
            pool.close()
    inside = []
    host, _, port = addresses[0].rpartition(":")
    bare = _TimedClient(clickhouse_connect.get_client(host=host, port=int(port), **CLIENT_OPTIONS), inside)

    def passthrough(sql: str) -> Any:
        return bare.query(sql)

    try:
        out["floor"] = measure(lambda: passthrough(SELECT_1), inside)
    finally:
        bare.close()
    return out


def pool_python_work_us(strategies: Sequence[str], n: int = 5000) -> dict[str, float]:
    """The pool's own Python work per statement, by strategy: a pool over in-process fake
    clients (no I/O, from tests/fakes.py) against calling a fake client directly, best of 5.
    Empty when the tests directory is not there (an installed package)."""
    import sys
    import timeit
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        from tests.fakes import FakeCluster, make_pool
    except ImportError:
        return {}
    fake = FakeCluster("a", "b", "c")
    client = fake.factory(host="a")
    direct = min(timeit.repeat(lambda: client.query(SELECT_1), number=n, repeat=5)) / n
    out = {}
    for strategy in strategies:
        query = make_pool(fake, load_balancing=strategy).query
        pooled = min(timeit.repeat(lambda q=query: q(SELECT_1), number=n, repeat=5)) / n  # type: ignore[misc]
        out[strategy] = (pooled - direct) * 1e6
    return out


def _interleaved_medians(targets: dict[str, Target], order: Sequence[Contender], sql: str, count: int, *,
                         rng: random.Random | None = None, scramblers: Sequence[Target] = ()) -> dict[str, float]:
    """``count`` statements per contender on this thread, one of each in turn, and each
    contender's median latency.

    On this machine a statement is faster right after another one on the same replica (that
    replica process is awake and warm; with replicas on their own machines it would not be).
    Left alone, that favours contenders whose choice correlates with the previous statement's:
    a fixed turn order, or two round-robin contenders stepping in phase (a bare round robin
    started at r1 moves in lockstep with HAProxy's). So the turn order is shuffled, and before
    every measured statement an unmeasured SELECT 1 goes to a random replica (``scramblers``):
    every contender then finds a random replica warm, whatever it picks."""
    rng = rng or random.Random(count)
    times: dict[str, list[float]] = {c.name: [] for c in order}
    names = [c.name for c in order]
    for _ in range(count):
        rng.shuffle(names)
        for name in names:
            if scramblers:
                scramblers[rng.randrange(len(scramblers))].query(SELECT_1)
            query = targets[name].query
            start = time.perf_counter()
            query(sql)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(samples) for name, samples in times.items()}


def _for_seconds(target: Target, sql: str, threads: int, seconds: float) -> list[Outcome]:
    stop = threading.Event()
    t0 = time.perf_counter()
    join = run_until(target.query, sql, threads, t0, stop)
    _sleep_until(t0 + seconds)
    stop.set()
    return join()


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
