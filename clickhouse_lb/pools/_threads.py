"""The worker threads of every sync pool of the process: one executor for attempt runs (hedged
reads, transports the pool cannot shut down), one for liveness checks and best-effort KILLs.

Process-wide rather than per pool: an application that builds a pool (or a SQLAlchemy engine)
per request and never closes it must not leave threads behind per pool. Created on first use;
recreated in a forked child (a fork copies no threads).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading

__all__ = ["attempt_executor", "check_executor"]

_lock = threading.Lock()
_executors: dict[str, cf.ThreadPoolExecutor] = {}
_SIZES = {"attempt": 64, "check": 16}


def _executor(kind: str) -> cf.ThreadPoolExecutor:
    executor = _executors.get(kind)
    if executor is None:
        with _lock:
            executor = _executors.get(kind)
            if executor is None:
                executor = cf.ThreadPoolExecutor(max_workers=_SIZES[kind], thread_name_prefix=f"clickhouse-lb-{kind}")
                _executors[kind] = executor
    return executor


def attempt_executor() -> cf.ThreadPoolExecutor:
    return _executor("attempt")


def check_executor() -> cf.ThreadPoolExecutor:
    return _executor("check")


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()
    _executors.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
