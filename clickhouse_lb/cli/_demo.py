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

Here: the entry point. The parts: :mod:`~clickhouse_lb.cli._demo_plan` (options, tour, timing),
:mod:`~clickhouse_lb.cli._demo_tally` (what is counted, the claims),
:mod:`~clickhouse_lb.cli._demo_screen` (output), :mod:`~clickhouse_lb.cli._demo_run` (the run).
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any, TextIO

from clickhouse_lb._redact import redact
from clickhouse_lb.cli._console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
)
from clickhouse_lb.cli._demo_plan import (
    ERRORS_EXPLAINED,
    REPLICA_START_GUESS,
    TOUR,
    WHO,
    DemoOptions,
    Timing,
    estimated_seconds,
)
from clickhouse_lb.cli._demo_run import DESCRIPTIONS, Demo
from clickhouse_lb.cli._demo_screen import Screen
from clickhouse_lb.cli._demo_tally import (
    Claims,
    RecentShare,
    Tally,
)
from clickhouse_lb.cli._local import chdb_available, chdb_missing, raise_interrupt, signals, stopping

# Also the parts the demo is made of (cli/_demo_*.py), under the names they had here.
__all__ = [
    "CHDB_MISSING",
    "DESCRIPTIONS",
    "TOUR",
    "Claims",
    "Demo",
    "DemoOptions",
    "RecentShare",
    "Screen",
    "Tally",
    "Timing",
    "estimated_seconds",
    "run_demo",
]

CHDB_MISSING = chdb_missing("demo")


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
