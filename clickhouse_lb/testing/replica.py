"""Entry point of one local replica process.

``python -m clickhouse_lb.testing.replica --host 127.0.0.11 --port 0 --name r1 --data-dir D``

The process serves ClickHouse's HTTP interface (see :mod:`clickhouse_lb.testing.server`) on
``host:port`` (port 0: the kernel picks one) and writes the bound port to ``--port-file`` once it
accepts connections. It logs to ``D/replica.log``, never to the terminal.

Parent-death safety: a daemon thread polls ``os.getppid()`` and exits the process as soon as the
parent is gone; with ``--pdeathsig`` (Linux) the kernel also sends SIGKILL when the parent dies,
which works even while the replica is stopped by SIGSTOP. (PR_SET_PDEATHSIG fires when the
*thread* that spawned the child exits: the cluster spawns every replica from one long-lived
thread, see :mod:`clickhouse_lb.testing._orphans`.) SIGTERM and SIGINT stop the server cleanly.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import ssl
import sys
import threading
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _set_pdeathsig() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, start the replica and serve until stopped."""
    parser = argparse.ArgumentParser(description="A local ClickHouse replica (chdb behind ClickHouse's HTTP API)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--name", required=True)
    parser.add_argument("--shard", default="01")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--port-file", default=None)
    parser.add_argument("--cluster-name", default="lb_cluster", help="the cluster name ON CLUSTER accepts")
    parser.add_argument("--replication-dir", default=None, help="the cluster's shared replication log directory")
    parser.add_argument("--cluster-file", default=None, help="JSON description of the cluster (system.clusters)")
    parser.add_argument(
        "--password-env", default=None, help="name of an environment variable holding the password of user default"
    )
    parser.add_argument(
        "--users-env", default=None, help="name of an environment variable holding more users (JSON, see _request)"
    )
    parser.add_argument("--tls-cert", default=None, help="PEM certificate chain: also serve HTTPS")
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    parser.add_argument("--https-port", type=int, default=0)
    parser.add_argument("--https-port-file", default=None)
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    parser.add_argument("--pdeathsig", action="store_true", help="Linux: SIGKILL this process when its parent dies")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)

    if args.pdeathsig:
        _set_pdeathsig()
    parent = args.parent_pid if args.parent_pid is not None else os.getppid()
    if os.getppid() != parent:  # parent died before we got here
        return 0
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch", daemon=True).start()

    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=str(data_dir / "replica.log"),
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(process)d %(threadName)s %(levelname)s %(name)s: %(message)s",
    )
    log = logging.getLogger("clickhouse_lb.testing.replica")
    password = os.environ.get(args.password_env, "") if args.password_env else ""

    from clickhouse_lb.testing import _blackhole
    from clickhouse_lb.testing._users import users_from_json
    from clickhouse_lb.testing.server import ReplicaServer

    users = users_from_json(os.environ.get(args.users_env) or "{}") if args.users_env else {}
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    server = ReplicaServer(
        args.name,
        data_dir,
        args.host,
        args.port,
        password=password,
        shard=args.shard,
        users=users,
        tls=tls,
        https_port=args.https_port,
        cluster_name=args.cluster_name,
        replication_dir=args.replication_dir,
        cluster_file=args.cluster_file,
    )
    control = _blackhole.serve(server, args.host, data_dir)

    # The handler only sets a flag (logging from a signal handler can deadlock on the logging
    # lock held by the code it interrupted); the stop is logged below, when serving ends.
    signal.signal(signal.SIGTERM, control.stop)
    signal.signal(signal.SIGINT, control.stop)
    log.info("replica %s (engine %s) listening on %s:%s", args.name, server.version, args.host, server.port)
    if args.https_port_file and server.https is not None:  # before the port file: that one says "ready"
        tmp = Path(args.https_port_file + ".tmp")
        tmp.write_text(str(server.https.port))
        os.replace(tmp, args.https_port_file)
    if args.port_file:
        tmp = Path(args.port_file + ".tmp")
        tmp.write_text(str(server.port))
        os.replace(tmp, args.port_file)
    try:
        _blackhole.serve_forever(control, args.host, data_dir)
    finally:
        server.http.server_close()
    log.info("replica %s stopped", args.name)
    # The engine's own shutdown can be slow; the data is already on disk.
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
