"""The ``clickhouse-lb`` command (also ``python -m clickhouse_lb``).

* ``clickhouse-lb demo``: start a local 3-replica cluster (the real ClickHouse engine via chdb,
  the ``local`` extra) and show the strategies at work, a replica killed mid-run and its return
  to rotation after decay. See :mod:`clickhouse_lb.cli._demo`.
* ``clickhouse-lb cluster``: a local cluster in the foreground until Ctrl-C, printing its hosts, a
  DSN and a SQLAlchemy URL to try things against. See :mod:`clickhouse_lb.cli._cluster`.
* ``clickhouse-lb status <dsn or hosts>``: ping every replica and print address, up, latency,
  server version, what the pool's health probes see (state, last probe, delay),
  ``errors_count``, ``estimated_recovery_time``, ``in_flight`` and ``latency_ewma``; the exit
  status says whether at least ``--min-healthy`` replicas answered (``--json`` for scripts,
  ``--watch`` to refresh).

Exit statuses: 0 success, 1 the check (or the demo's claims) failed, 2 bad arguments or a missing
extra, 130 interrupted. Passwords never appear in the output: pass them with ``--password``, the
``CLICKHOUSE_PASSWORD`` environment variable, or inside a DSN.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

from clickhouse_lb._redact import redact
from clickhouse_lb._version import __version__
from clickhouse_lb.cli._arguments import Command, int_between, positive_seconds, verbose_option
from clickhouse_lb.cli._cluster import CLUSTER_COMMAND
from clickhouse_lb.cli._console import EXIT_INTERRUPTED, EXIT_USAGE, format_table, short_error
from clickhouse_lb.cli._status import PASSWORD_ENV, ReplicaCheck, check_replicas, run_status
from clickhouse_lb.config.settings import LoadBalancing
from clickhouse_lb.errors import ConfigurationError

__all__ = [
    "ReplicaCheck", "build_parser", "check_replicas", "format_table", "library_logging", "main", "run_status",
    "short_error",
]


@contextmanager
def library_logging(verbosity: int, stream: TextIO | None = None) -> Iterator[None]:
    """Route the ``clickhouse_lb`` (and ``clickhouse_connect``) loggers for the command's duration.

    0: silent (the command reports what matters itself); 1: ``clickhouse_lb`` at INFO on stderr;
    2 or more: ``clickhouse_lb`` at DEBUG and clickhouse-connect's warnings too. The loggers'
    previous level, handlers and propagation are restored afterwards.
    """
    names = ("clickhouse_lb", "clickhouse_connect")
    saved = {name: _logger_state(logging.getLogger(name)) for name in names}
    try:
        for name in names:
            level = _verbosity_level(name, verbosity)
            handler: logging.Handler = logging.NullHandler()
            if level is not None:
                handler = logging.StreamHandler(stream or sys.stderr)
                handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logger = logging.getLogger(name)
            logger.handlers = [handler]
            logger.propagate = False
            logger.setLevel(level if level is not None else logging.CRITICAL + 1)
        yield
    finally:
        for name, state in saved.items():
            logger = logging.getLogger(name)
            logger.setLevel(state[0])
            logger.handlers = state[1]
            logger.propagate = state[2]


def _logger_state(logger: logging.Logger) -> tuple[int, list[logging.Handler], bool]:
    return logger.level, list(logger.handlers), logger.propagate


def _verbosity_level(name: str, verbosity: int) -> int | None:
    if name == "clickhouse_lb":
        return None if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    return logging.WARNING if verbosity >= 2 else None


# -- demo --------------------------------------------------------------------------------------


def run_demo_command(args: argparse.Namespace, out: TextIO) -> int:
    """``clickhouse-lb demo`` (in :mod:`clickhouse_lb.cli._demo`, which needs the ``local`` extra)."""
    from clickhouse_lb.cli._demo import DemoOptions, run_demo

    options = DemoOptions(
        replicas=args.replicas,
        strategy=LoadBalancing.parse(args.strategy) if args.strategy else None,
        duration=args.duration,
        threads=args.threads,
        verbose=args.verbose,
    )
    return run_demo(options, out)


# -- command line ------------------------------------------------------------------------------


_VERBOSE = "log the library's events on stderr (-v: INFO, failovers and recoveries; -vv: DEBUG, every attempt)"


def _demo_arguments(demo: argparse.ArgumentParser) -> None:
    choices = ", ".join(m.value for m in LoadBalancing)
    demo.add_argument("--replicas", type=_demo_replicas, default=3, help="number of replicas (2-9, default 3)")
    demo.add_argument(
        "--strategy", default=None, metavar="NAME",
        help=f"run only this strategy in the tour and use it for the kill and the restart ({choices}); "
        "default: a tour of five, then round_robin",
    )
    demo.add_argument(
        "--duration", type=positive_seconds, default=40.0, metavar="SECONDS",
        help="length of the workload phases, scaled together (default 40; the cluster start comes on top)",
    )
    demo.add_argument("--threads", type=int, choices=range(1, 17), default=3, metavar="N",
                      help="client threads running the workload (default 3)")
    verbose_option(demo, _VERBOSE)


_demo_replicas = int_between(2, 9, "the demo needs 2 to 9 replicas (one is killed on the way)")

_DEMO_COMMAND = Command(
    "demo",
    help="start a local cluster and show the strategies, a failover and a recovery",
    description=(
        "Start a local cluster of real ClickHouse replicas (chdb: the 'local' extra), "
        "run a workload through several load_balancing strategies, kill a replica mid-run (no statement "
        "fails, its errors rise, traffic moves) and restart it (it returns to rotation once its errors "
        "decay). Ctrl-C stops cleanly. Exit 0 when the run met those claims."
    ),
    arguments=_demo_arguments,
    run=run_demo_command,
)


def _status_arguments(status: argparse.ArgumentParser) -> None:
    status.add_argument(
        "targets", nargs="+", metavar="DSN_OR_HOSTS",
        help="clickhouse://user:pw@h1:8123,h2:8123/db, or hosts: 'h1:8123,h2:8123' or h1:8123 h2:8123",
    )
    status.add_argument("--user", default=None, help="user name (default: the DSN's, else 'default')")
    status.add_argument("--password", default=None, help=f"password (default: the DSN's, else ${PASSWORD_ENV})")
    status.add_argument("--database", default=None, help="database (default: the DSN's, else 'default')")
    status.add_argument("--secure", action="store_true", help="HTTPS (default port 8443)")
    status.add_argument("--timeout", type=positive_seconds, default=3.0, metavar="SECONDS",
                        help="connect and read timeout per request (default 3)")
    status.add_argument("--min-healthy", type=int, default=1, metavar="N",
                        help="exit 1 when fewer replicas than this answer (default 1)")
    status.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    status.add_argument("--watch", type=positive_seconds, nargs="?", const=2.0, default=None, metavar="SECONDS",
                        help="refresh every SECONDS (default 2) until interrupted; the probes keep running between")
    status.add_argument("--count", type=int, default=None, metavar="N",
                        help="with --watch: stop after N reports")
    verbose_option(status, _VERBOSE)


_STATUS_COMMAND = Command(
    "status",
    help="ping every replica and print a health table",
    description=(
        "Ping every replica and print address, up, latency, server version, the health probes' view "
        "(probe state, last probe, replication delay), errors_count, estimated_recovery_time, in_flight "
        "and latency_ewma. Exit 0 when at least --min-healthy replicas answer (at the last refresh with "
        f"--watch), 1 otherwise, 2 on bad arguments. The password can also come from ${PASSWORD_ENV}."
    ),
    arguments=_status_arguments,
    run=run_status,
)

#: The sub-commands, in the order ``clickhouse-lb --help`` lists them.
COMMANDS = {command.name: command for command in (CLUSTER_COMMAND, _DEMO_COMMAND, _STATUS_COMMAND)}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``clickhouse-lb``."""
    parser = argparse.ArgumentParser(
        prog="clickhouse-lb",
        description="ClickHouse's load_balancing, error accounting and failover on the client side.",
    )
    parser.add_argument("--version", action="version", version=f"clickhouse-lb {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS.values():
        command.add_to(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``clickhouse-lb`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    out = sys.stdout
    try:
        with library_logging(args.verbose):
            return COMMANDS[args.command].run(args, out)
    except ConfigurationError as exc:
        print(f"clickhouse-lb {args.command}: {redact(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"clickhouse-lb {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
