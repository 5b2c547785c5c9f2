"""``clickhouse-lb cluster``: a local cluster in the foreground, to point examples and tools at.

It starts a :class:`~clickhouse_lb.testing.LocalCluster` (n replica processes running the real
ClickHouse engine through chdb: the ``local`` extra), optionally with a user of your choosing
(``--user NAME:PASSWORD``), a database created on every replica (``--database NAME``, through
``CREATE DATABASE ... ON CLUSTER``), HTTPS (``--tls``, a test CA whose file is printed) and one
port shared by every replica on its own loopback address (``--shared-port``, Linux). It prints
the replicas' addresses, a multi-host DSN for :func:`clickhouse_lb.get_pool` and
``clickhouse-lb status``, and a ``clickhousedb+lb://`` URL for SQLAlchemy (``--json``: the same
as one JSON line first, for scripts), then serves until Ctrl-C or SIGTERM and stops every
replica and removes its files (exit 0).

The DSN and URL carry the password given with ``--user``: it is a throwaway cluster on
loopback, and what is printed is meant to be pasted as is.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import quote

from clickhouse_lb._redact import redact
from clickhouse_lb.cli._arguments import Command, int_between, verbose_option
from clickhouse_lb.cli._console import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, format_table
from clickhouse_lb.cli._local import chdb_available, chdb_missing, raise_interrupt, signals, stopping

__all__ = ["CLUSTER_COMMAND", "ClusterOptions", "Endpoints", "endpoints", "run_cluster"]

MAX_REPLICAS = 9
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: How often the foreground loop looks at the replicas (a replica that died is reported).
_WATCH_SECONDS = 0.5


@dataclass(frozen=True)
class ClusterOptions:
    """What ``clickhouse-lb cluster`` was asked for."""

    replicas: int = 3
    shared_port: bool = False
    user: str | None = None
    password: str = ""
    database: str | None = None
    tls: bool = False
    json: bool = False


@dataclass(frozen=True)
class Endpoints:
    """How to reach the cluster: ``host:port`` of every replica, a DSN and a SQLAlchemy URL."""

    hosts: list[str]
    dsn: str
    url: str

    def as_dict(self) -> dict[str, Any]:
        return {"hosts": list(self.hosts), "dsn": self.dsn, "url": self.url}


def endpoints(
    hosts: list[str],
    *,
    user: str | None = None,
    password: str = "",
    database: str | None = None,
    ca_cert: str | None = None,
) -> Endpoints:
    """The DSN (``clickhouse://user:pw@h1:p1,h2:p2/db``, the form of
    :func:`clickhouse_lb.config.replicas.parse_dsn`) and the URL (``clickhousedb+lb://``, the forms
    of :mod:`clickhouse_lb.sqlalchemy.url`: one shared port written once, else repeated ``host=``).
    ``ca_cert``: the replicas serve HTTPS, verified against that CA file."""
    userinfo = ""
    if user is not None:
        userinfo = quote(user, safe="") + (":" + quote(password, safe="") if password else "") + "@"
    db = quote(database or "default", safe="")
    query = f"?ca_cert={quote(ca_cert, safe='/')}" if ca_cert else ""
    dsn = f"{'clickhouses' if ca_cert else 'clickhouse'}://{userinfo}{','.join(hosts)}/{db}{query}"
    tls = f"secure=true&ca_cert={quote(ca_cert, safe='/')}" if ca_cert else ""
    ports = {h.rpartition(":")[2] for h in hosts}
    if len(ports) == 1 and len(hosts) > 1:
        (port,) = ports
        names = ",".join(h.rpartition(":")[0] for h in hosts)
        url = f"clickhousedb+lb://{userinfo}{names}:{port}/{db}" + (f"?{tls}" if tls else "")
    else:
        params = "&".join(f"host={h}" for h in hosts) + (f"&{tls}" if tls else "")
        url = f"clickhousedb+lb://{userinfo}/{db}?{params}"
    return Endpoints(list(hosts), dsn, url)


# -- arguments ---------------------------------------------------------------------------------


_replica_count = int_between(1, MAX_REPLICAS, f"expected 1 to {MAX_REPLICAS} replicas, not {{value}}")


def user_and_password(text: str) -> tuple[str, str]:
    """``NAME:PASSWORD`` (the password may hold ':'; ``NAME`` alone: no password)."""
    name, _, password = text.partition(":")
    if not _IDENTIFIER.fullmatch(name):
        raise argparse.ArgumentTypeError(
            "expected NAME:PASSWORD with NAME of letters, digits and '_' (not starting with a digit), "
            f"not {redact(name)!r}"
        )
    return name, password


def database_name(text: str) -> str:
    if not _IDENTIFIER.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"expected a database name of letters, digits and '_' (not starting with a digit), not {text!r}"
        )
    return text


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=_replica_count, default=3, metavar="N",
                        help=f"number of replicas (1-{MAX_REPLICAS}, default 3)")
    parser.add_argument("--shared-port", action="store_true",
                        help="every replica on the same port, each on its own 127.0.0.x address (Linux)")
    parser.add_argument("--user", type=user_and_password, default=None, metavar="NAME:PASSWORD",
                        help="create this user on every replica (default: user 'default', no password)")
    parser.add_argument("--database", type=database_name, default=None, metavar="NAME",
                        help="create this database on every replica (ON CLUSTER) and name it in the DSN")
    parser.add_argument("--tls", action="store_true",
                        help="serve HTTPS with a certificate of a test CA (its file is printed: ca_cert)")
    parser.add_argument("--json", action="store_true",
                        help='print {"hosts": [...], "dsn": ..., "url": ...} as the first line')
    verbose_option(parser, "log the library's events on stderr")


def options_from_args(args: argparse.Namespace) -> ClusterOptions:
    user, password = args.user if args.user is not None else (None, "")
    return ClusterOptions(
        replicas=args.replicas, shared_port=args.shared_port, user=user, password=password,
        database=args.database, tls=args.tls, json=args.json,
    )


# -- running -----------------------------------------------------------------------------------


def _new_cluster(options: ClusterOptions) -> Any:
    from clickhouse_lb.testing import LocalCluster, User

    users = {}
    password = ""
    if options.user == "default":
        password = options.password
    elif options.user is not None:
        users[options.user] = User(options.password)
    return LocalCluster(
        replicas=options.replicas, users=users, password=password, tls=options.tls, shared_port=options.shared_port
    )


def cluster_endpoints(cluster: Any, options: ClusterOptions) -> Endpoints:
    if options.tls:
        hosts = [f"{host}:{port}" for host, port in (cluster.https_address(i) for i in range(options.replicas))]
    else:
        hosts = list(cluster.hosts)
    return endpoints(
        hosts, user=options.user, password=options.password, database=options.database,
        ca_cert=str(cluster.ca_path) if options.tls else None,
    )


def describe(cluster: Any, options: ClusterOptions, found: Endpoints, took: float) -> list[str]:
    """The human-readable lines printed once the cluster is up."""
    lines = [
        f"clickhouse-lb cluster: {options.replicas} local replica{'s' if options.replicas != 1 else ''} "
        f"of cluster {cluster.cluster_name} (the real ClickHouse engine, via chdb), up in {took:.1f} s",
        "",
        *format_table(("replica", "address"), list(zip(cluster.names, found.hosts)), indent="  "),
        "",
        f"user:     {options.user or 'default'}"
        + (" (with the password given)" if options.password else " (no password)"),
        f"database: {options.database or 'default'}"
        + (" (created on every replica)" if options.database else ""),
    ]
    if options.tls:
        lines.append(f"ca_cert:  {cluster.ca_path}")
    lines += [
        f"dsn:      {found.dsn}",
        f"url:      {found.url}",
        f"files:    {cluster.base_dir} (removed on exit)",
        "",
        "try:      clickhouse-lb status '" + found.dsn + "'",
        "          python -c \"import clickhouse_lb; print(clickhouse_lb.get_pool(dsn='" + found.dsn
        + "').command('SELECT version()'))\"",
        "",
        "serving until Ctrl-C (or SIGTERM); then every replica stops and its files are removed",
    ]
    return lines


def _serve(cluster: Any, err: TextIO) -> None:
    """Until interrupted; a replica that dies on its own is reported once (the others go on)."""
    reported: set[int] = set()
    while True:
        time.sleep(_WATCH_SECONDS)
        for i, name in enumerate(cluster.names):
            if i not in reported and not cluster.is_alive(i):
                reported.add(i)
                print(f"clickhouse-lb cluster: replica {name} exited; the others keep serving", file=err, flush=True)


def run_cluster(options: ClusterOptions, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """0 after Ctrl-C/SIGTERM, 1 when the cluster failed to start, 2 without chdb, 130 when
    interrupted while starting."""
    out = out or sys.stdout
    err = err or sys.stderr
    if not chdb_available():
        print(chdb_missing("cluster"), file=err)
        return EXIT_USAGE
    from clickhouse_lb.testing import ClusterError

    try:
        cluster = _new_cluster(options)
    except ValueError as exc:  # e.g. --shared-port off Linux
        print(f"clickhouse-lb cluster: {redact(str(exc))}", file=err)
        return EXIT_USAGE
    serving = False
    with signals({signal.SIGTERM: raise_interrupt}):
        try:
            started = time.monotonic()
            cluster.start()
            if options.database:
                cluster.query(0, f"CREATE DATABASE IF NOT EXISTS {options.database} ON CLUSTER {cluster.cluster_name}")
            took = time.monotonic() - started
            found = cluster_endpoints(cluster, options)
            if options.json:
                document = {**found.as_dict(), "cluster": cluster.cluster_name, "base_dir": str(cluster.base_dir)}
                if options.tls:
                    document["ca_cert"] = str(cluster.ca_path)
                out.write(json.dumps(document) + "\n")
            out.write("\n".join(describe(cluster, options, found, took)) + "\n")
            out.flush()
            serving = True
            _serve(cluster, err)
        except KeyboardInterrupt:
            pass
        except Exception as exc:  # a replica that did not start, the database not created: said, not a traceback
            what = "the local cluster failed"
            if not isinstance(exc, ClusterError):
                what = f"starting the cluster failed ({type(exc).__name__})"
            print(f"clickhouse-lb cluster: {what}: {redact(str(exc))}", file=err)
            return EXIT_FAILED
        finally:
            with stopping():
                cluster.close()
    if not serving:
        print("clickhouse-lb cluster: interrupted while starting; stopped", file=err)
        return EXIT_INTERRUPTED
    print("stopped: every replica is gone and its files are removed", file=out, flush=True)
    return EXIT_OK


CLUSTER_COMMAND = Command(
    "cluster",
    help="run a local cluster in the foreground and print how to connect to it",
    description=(
        "Start a local cluster of real ClickHouse replicas (chdb: the 'local' extra), print the replicas' "
        "addresses, a DSN and a SQLAlchemy URL, and serve until Ctrl-C or SIGTERM; then every replica "
        "stops and its files are removed (exit 0)."
    ),
    arguments=_arguments,
    run=lambda args, out: run_cluster(options_from_args(args), out),
)
