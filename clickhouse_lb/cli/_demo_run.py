"""The run of ``clickhouse-lb demo``: the strategy tour, a replica killed and restarted, the live
table and the summary (see :mod:`clickhouse_lb.cli._demo`)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from clickhouse_lb.cli._console import (
    format_table,
    short_error,
)
from clickhouse_lb.cli._demo_plan import (
    LIVE_REFRESH,
    STATEMENT_TIMEOUT,
    DemoOptions,
    Timing,
)
from clickhouse_lb.cli._demo_screen import Screen
from clickhouse_lb.cli._demo_tally import (
    Claims,
    EventLog,
    RecentShare,
    Tally,
    Workload,
    shares,
)
from clickhouse_lb.config.settings import LoadBalancing
from clickhouse_lb.core.events import FailoverEvent, ReplicaRecoveredEvent
from clickhouse_lb.pools.pool import ReplicaPool, get_pool

# The demo's parts are re-exported: one name space for the tests and for reading.


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
        pool, self._pool = self._pool, None
        if pool is not None:
            if workload is not None:
                self.failovers += pool.stats.failovers
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
        assert self._pool is not None
        header = ("replica", "address", "process", "served", f"share (last {self.timing.window:.0f} s)",
                  "errors_count", "recovers in", "errors recorded")
        failed = self.screen.paint(str(tally.failed), "bad" if tally.failed else "good")
        return [
            *format_table(header, self._replica_rows(tally, share), indent="    "),
            f"    {label}  {self.elapsed()}  statements {tally.statements}  failed {failed}  "
            f"failovers {self._pool.stats.failovers}",
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
        assert self._pool is not None  # the fault phase's pool, closed by the next phase
        self.claims.failovers = self._pool.stats.failovers

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
