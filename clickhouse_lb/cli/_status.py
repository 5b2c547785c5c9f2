"""``clickhouse-lb status``: ping every replica and report what the pool sees of each.

Address, up, latency, server version, what the pool's health probes see (state, last probe,
delay), ``errors_count``, ``estimated_recovery_time``, ``in_flight`` and ``latency_ewma``; the
exit status says whether at least ``--min-healthy`` replicas answered (``--json`` for scripts,
``--watch`` to refresh). Passwords never appear in the output: pass them with ``--password``,
the ``CLICKHOUSE_PASSWORD`` environment variable, or inside a DSN. The arguments are declared in
:mod:`clickhouse_lb.cli._main`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from clickhouse_lb._redact import redact
from clickhouse_lb.cli._console import EXIT_FAILED, EXIT_OK, format_table, short_error
from clickhouse_lb.config.replicas import split_host_list
from clickhouse_lb.core.balancer import ReplicaStatus
from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.pools.pool import ReplicaPool, get_pool

__all__ = [
    "PASSWORD_ENV",
    "PoolFactory",
    "ReplicaCheck",
    "check_replicas",
    "open_status_pool",
    "run_status",
    "status_lines",
    "status_pool_options",
    "status_report",
    "status_targets",
]

PASSWORD_ENV = "CLICKHOUSE_PASSWORD"

PoolFactory = Callable[..., ReplicaPool]


@dataclass(frozen=True)
class ReplicaCheck:
    """What ``status`` found out about one replica."""

    address: str
    up: bool
    latency_ms: float | None
    version: str | None
    errors_count: int
    estimated_recovery_time: float
    error: str | None
    #: What the pool's background health probes saw (``off`` when probing is turned off).
    probe_state: str = "off"
    #: Seconds between the latest finished probe and this report.
    last_probe_age: float | None = None
    probe_latency_ms: float | None = None
    #: Replication delay in seconds, when known.
    delay: float | None = None
    #: The pool's load view (``least_loaded``): attempts running there, latency average in seconds.
    in_flight: int = 0
    latency_ewma: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def status_targets(targets: Sequence[str]) -> tuple[str | None, list[str] | None]:
    """``(dsn, hosts)`` from the positional arguments: one DSN, or host lists."""
    dsns = [t for t in targets if "://" in t]
    if dsns and len(targets) > 1:
        raise ConfigurationError("Give either one DSN or host names (host:port, ...), not both")
    if dsns:
        return dsns[0], None
    for target in targets:
        if "@" in target:
            # Never echo it: it may carry a password.
            raise ConfigurationError(
                "A host argument contains '@': give credentials with --user/--password "
                f"(or ${PASSWORD_ENV}), or pass one DSN (clickhouse://...)"
            )
        split_host_list(target, "give hosts as h1:8123,h2:8123 (or as separate arguments), with no empty one")
    return None, list(targets)


def status_pool_options(args: argparse.Namespace) -> dict[str, Any]:
    """get_pool keywords for ``status``: credentials, TLS, and every timeout bounded by --timeout."""
    if not args.timeout > 0:
        raise ConfigurationError(f"Bad --timeout {args.timeout!r}: expected seconds > 0")
    seconds = math.ceil(args.timeout)
    options: dict[str, Any] = {
        "connect_timeout_with_failover_ms": max(1, round(args.timeout * 1000)),
        "connect_timeout": seconds,
        "send_receive_timeout": seconds,
        "connections_with_failover_max_tries": 1,
    }
    password = args.password if args.password is not None else os.environ.get(PASSWORD_ENV)
    for name, value in (("username", args.user), ("password", password), ("database", args.database)):
        if value is not None:
            options[name] = value
    if args.secure:
        options["secure"] = True
    return options


def open_status_pool(args: argparse.Namespace, factory: PoolFactory = get_pool) -> ReplicaPool:
    """The pool ``status`` checks (raises ConfigurationError on bad arguments, before any I/O)."""
    dsn, hosts = status_targets(args.targets)
    # Lazy: status probes and reports every replica itself, whichever of them answer.
    return factory(hosts, dsn=dsn, connect_on_create=False, **status_pool_options(args))


def _probe(pool: ReplicaPool, address: str, timeout: float) -> tuple[float | None, str | None, str | None]:
    """``(latency_ms, version, error)`` of one replica. A replica failure counts an error
    against it; a query failure (authentication, permissions, ...) is reported, not counted."""
    load = pool.balancer.state.replica_load
    index = pool.balancer.index_of(address)
    try:
        client = pool.client(address)  # creating a client already talks to the server
        started = time.perf_counter()
        # The ping is an attempt like a statement's: it feeds the replica's latency average.
        in_flight_since = load.start(index)
        try:
            answered = client.ping(timeout)
        finally:
            load.finish(index, in_flight_since)
        latency = (time.perf_counter() - started) * 1000.0
        if not answered:
            pool.record_error(address, "ping failed")
            return None, None, "ping failed"
        version = str(client.command("SELECT version()"))
    except Exception as exc:
        balancer = pool.balancer
        return None, None, balancer.count_failure(balancer.index_of(address), exc).reason
    return latency, version, None


def check_replicas(pool: ReplicaPool, timeout: float) -> list[ReplicaCheck]:
    """Probe every replica of ``pool`` concurrently; report with the pool's counts afterwards."""
    addresses = pool.addresses
    with ThreadPoolExecutor(max_workers=min(16, len(addresses)), thread_name_prefix="clickhouse-lb-status") as ex:
        probes = list(ex.map(lambda address: _probe(pool, address, timeout), addresses))
    checks = []
    now = time.time()
    for status, (latency, version, error) in zip(pool.replicas, probes):
        last_probe = status.last_probe_time
        checks.append(
            ReplicaCheck(
                address=status.address,
                up=error is None,
                latency_ms=None if latency is None else round(latency, 2),
                version=version,
                errors_count=status.errors_count,
                estimated_recovery_time=round(status.estimated_recovery_time, 3),
                error=None if error is None else redact(error),
                probe_state=status.probe_state,
                last_probe_age=None if last_probe is None else round(max(0.0, now - last_probe), 3),
                probe_latency_ms=None if status.probe_latency is None else round(status.probe_latency * 1000, 2),
                delay=status.delay,
                in_flight=status.in_flight,
                latency_ewma=None if status.latency_ewma is None else round(status.latency_ewma, 6),
            )
        )
    return checks


def start_probes(pool: ReplicaPool, wait: float) -> None:
    """Start the pool's health probes (a statement would) and wait, at most ``wait`` seconds,
    for their first sweep and the replication delays of the replicas they see up, so that the
    report shows what they saw."""
    prober = getattr(pool, "_prober", None)
    if prober is None:
        return
    prober.ensure_started()
    delays = pool.config.health.health_check_delay_interval_ms > 0

    def seen(status: ReplicaStatus) -> bool:
        if status.last_probe_time is None:
            return False
        return not delays or status.probe_state != "up" or status.delay is not None

    deadline = time.monotonic() + wait
    while not all(seen(r) for r in pool.replicas) and time.monotonic() < deadline:
        time.sleep(0.01)


def status_report(checks: Sequence[ReplicaCheck], min_healthy: int) -> dict[str, Any]:
    """The ``--json`` document."""
    healthy = sum(c.up for c in checks)
    return {
        "replicas": [c.as_dict() for c in checks],
        "healthy": healthy,
        "total": len(checks),
        "min_healthy": min_healthy,
        "ok": healthy >= min_healthy,
    }


def status_lines(checks: Sequence[ReplicaCheck], min_healthy: int) -> list[str]:
    """The human-readable table and a verdict line."""
    header = ("address", "up", "latency", "version", "probe", "last_probe", "delay", "errors_count",
              "estimated_recovery_time", "in_flight", "latency_ewma", "error")
    rows = [
        (
            c.address,
            "yes" if c.up else "NO",
            "-" if c.latency_ms is None else f"{c.latency_ms:.1f} ms",
            c.version or "-",
            c.probe_state,
            "-" if c.last_probe_age is None else f"{c.last_probe_age:.1f} s ago",
            "-" if c.delay is None else f"{c.delay:.0f} s",
            str(c.errors_count),
            f"{c.estimated_recovery_time:.1f} s",
            str(c.in_flight),
            "-" if c.latency_ewma is None else f"{c.latency_ewma * 1000.0:.1f} ms",
            short_error(c.error),
        )
        for c in checks
    ]
    healthy = sum(c.up for c in checks)
    verdict = "OK" if healthy >= min_healthy else "FAILED"
    summary = f"{healthy}/{len(checks)} replicas answered (min {min_healthy}): {verdict}"
    return [*format_table(header, rows), "", summary]


def run_status(args: argparse.Namespace, out: TextIO, factory: PoolFactory = get_pool) -> int:
    """``clickhouse-lb status``: 0 when at least --min-healthy replicas answered, else 1."""
    if args.min_healthy < 0:
        raise ConfigurationError(f"Bad --min-healthy {args.min_healthy}: expected 0 or more")
    if args.count is not None and (args.watch is None or args.count < 1):
        raise ConfigurationError(f"Bad --count {args.count}: give it with --watch, as 1 or more")
    with open_status_pool(args, factory) as pool:
        if args.min_healthy > len(pool.addresses):
            raise ConfigurationError(
                f"--min-healthy {args.min_healthy} but only {len(pool.addresses)} replicas given"
            )
        start_probes(pool, wait=min(args.timeout, 2.0))
        refreshes = 0
        while True:
            checks = check_replicas(pool, args.timeout)
            if args.watch is not None and not args.json and out.isatty():
                out.write("\x1b[H\x1b[2J")  # redraw in place
            if args.json:
                out.write(json.dumps(status_report(checks, args.min_healthy), indent=2) + "\n")
            else:
                out.write("\n".join(status_lines(checks, args.min_healthy)) + "\n")
            out.flush()
            refreshes += 1
            if args.watch is None or (args.count is not None and refreshes >= args.count):
                break
            try:
                time.sleep(args.watch)
            except KeyboardInterrupt:  # the usual way to leave --watch
                break
    return EXIT_OK if sum(c.up for c in checks) >= args.min_healthy else EXIT_FAILED
