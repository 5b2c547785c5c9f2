"""What the commands that run a local cluster share: whether chdb is there, and signals.

``clickhouse-lb demo`` and ``clickhouse-lb cluster`` both start a
:class:`~clickhouse_lb.testing.LocalCluster` (the ``local`` extra) in the foreground; both turn
SIGTERM into the KeyboardInterrupt of Ctrl-C, and ignore both while they stop the replicas, so
that a second Ctrl-C cannot leave a replica or its files behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["chdb_available", "chdb_missing", "raise_interrupt", "signals", "stopping"]


def chdb_available() -> bool:
    """Whether the ``local`` extra (chdb) is installed."""
    return importlib.util.find_spec("chdb") is not None


def chdb_missing(command: str) -> str:
    """What ``clickhouse-lb COMMAND`` prints without chdb."""
    return (
        f"clickhouse-lb {command} runs a local cluster of real ClickHouse replicas through chdb, which is not "
        "installed.\nInstall it with:  pip install '.[local]'  (in a checkout of clickhouse-lb), or\n"
        "                  pip install 'clickhouse-lb[local] @ git+https://github.com/clickhouse-lb/clickhouse-lb'"
    )


def raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def signals(handlers: Mapping[int, Any]) -> Iterator[None]:
    """Install signal handlers for a block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def stopping() -> contextlib.AbstractContextManager[None]:
    """Ctrl-C and SIGTERM ignored for a block: the cleanup that must finish."""
    return signals({signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN})
