"""The contenders, as data, and the object each one runs statements through.

A contender is a :class:`Contender` entry; :func:`open_target` turns it into a :class:`Target`
(``query(sql)`` and ``close()``) over a running cluster (and HAProxy, when there is one).
Every contender's statements go through a clickhouse-connect ``Client.query`` with the same
options (no session id, no client-side retries), so the differences measured are the
balancing layer's: nothing else.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import clickhouse_connect

import clickhouse_lb

__all__ = [
    "BARE",
    "CONTENDERS",
    "NO_CHECKS",
    "Contender",
    "Target",
    "available",
    "by_name",
    "open_scrambler",
    "open_target",
    "pool_arguments",
]

#: What every bare client and every HAProxy client is given (the pool gives its own the same).
CLIENT_OPTIONS: Mapping[str, Any] = {"autogenerate_session_id": False, "query_retries": 0}


@dataclass(frozen=True)
class Contender:
    """``kind``: ``bare`` (one client to replica 0), ``bare_pick`` (one bare client per replica,
    picked per statement by ``strategy``: random or round_robin), ``pool`` (clickhouse-lb with
    ``load_balancing=strategy`` and ``options``), ``haproxy`` (one client to HAProxy's
    ``profile`` frontend). ``control``: the bare contender that picks replicas the same way, so
    that ``ratio to control`` is the balancing layer's own cost."""

    name: str
    kind: str
    description: str
    strategy: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    profile: str | None = None
    control: str | None = None


BARE = "bare"
#: What the pool did before hung-replica handling and health probes (issues 9 and 10): no
#: background ``/ping`` probes, no liveness-checked waits. The failover scenarios run it next to
#: ``pool_random`` (the defaults) to show what the two buy.
NO_CHECKS: Mapping[str, Any] = {"health_check_interval_ms": 0, "liveness_check_after_ms": 0}
CONTENDERS: tuple[Contender, ...] = (
    Contender(BARE, "bare", "one bare clickhouse-connect client to replica r1"),
    Contender("bare_random", "bare_pick", "3 bare clients, one picked at random per statement", "random"),
    Contender("bare_round_robin", "bare_pick", "3 bare clients, picked in turn", "round_robin"),
    Contender("pool_in_order", "pool", "clickhouse-lb, load_balancing=in_order", "in_order", control=BARE),
    Contender("pool_random", "pool",
              "clickhouse-lb, load_balancing=random, every other setting at its default (health probes and "
              "liveness-checked waits on)", "random", control="bare_random"),
    Contender("pool_random_no_checks", "pool",
              "clickhouse-lb random with health_check_interval_ms=0, liveness_check_after_ms=0: no health probes, "
              "no liveness checks (what the pool did before issues 9 and 10)", "random",
              options=NO_CHECKS, control="bare_random"),
    Contender("pool_hedged", "pool", "clickhouse-lb random with use_hedged_requests=1 (hedged reads)", "random",
              options={"use_hedged_requests": 1}, control="bare_random"),
    Contender("pool_round_robin", "pool", "clickhouse-lb, load_balancing=round_robin", "round_robin",
              control="bare_round_robin"),
    Contender("pool_first_or_random", "pool", "clickhouse-lb, load_balancing=first_or_random", "first_or_random",
              control=BARE),
    Contender("pool_least_loaded", "pool", "clickhouse-lb, load_balancing=least_loaded", "least_loaded",
              control="bare_random"),
    Contender("haproxy_default", "haproxy", "HAProxy, default profile (roundrobin)", profile="haproxy_default",
              control="bare_round_robin"),
    Contender("haproxy_tuned", "haproxy", "HAProxy, tuned profile (roundrobin)", profile="haproxy_tuned",
              control="bare_round_robin"),
    Contender("haproxy_leastconn", "haproxy", "HAProxy, tuned profile with balance leastconn",
              profile="haproxy_leastconn", control="bare_random"),
)


def by_name(name: str) -> Contender:
    for contender in CONTENDERS:
        if contender.name == name:
            return contender
    raise KeyError(f"unknown contender {name!r}; known: {', '.join(c.name for c in CONTENDERS)}")


class Target(Protocol):
    def query(self, sql: str) -> Sequence[Sequence[Any]]: ...

    def close(self) -> None: ...


class _Scrambler:
    """A bare client that wakes a replica between measured statements, with a urllib3 pool
    manager of its own: through the manager the bare contenders share, it would also warm the
    very connection a bare contender picks next (its socket and objects hot in the CPU's caches),
    a head start the pool's and HAProxy's connections never get (measured: a pool/bare ratio of
    1.14x with a shared manager, 1.04x with its own, for a 1-thread SELECT 1)."""

    def __init__(self, address: str) -> None:
        from clickhouse_connect.driver.httputil import get_pool_manager

        host, port = _split(address)
        self._client = clickhouse_connect.get_client(host=host, port=port, pool_mgr=get_pool_manager(maxsize=2),
                                                     **CLIENT_OPTIONS)

    def query(self, sql: str) -> Sequence[Sequence[Any]]:
        return self._client.query(sql).result_rows

    def close(self) -> None:
        self._client.close()


def open_scrambler(address: str) -> Target:
    """A client for the unmeasured statements between measured ones (see :class:`_Scrambler`)."""
    return _Scrambler(address)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


class _Client:
    """One clickhouse-connect client, created at once (it talks to the server)."""

    def __init__(self, host: str, port: int) -> None:
        self._client = clickhouse_connect.get_client(host=host, port=port, **CLIENT_OPTIONS)

    def query(self, sql: str) -> Sequence[Sequence[Any]]:
        return self._client.query(sql).result_rows

    def close(self) -> None:
        self._client.close()


class _Picked:
    """One bare client per replica, picked per statement (random, or in turn)."""

    def __init__(self, addresses: Sequence[str], strategy: str) -> None:
        self._clients = [clickhouse_connect.get_client(host=h, port=p, **CLIENT_OPTIONS)
                         for h, p in map(_split, addresses)]
        n = len(self._clients)
        if strategy == "random":
            self._pick: Callable[[], int] = lambda: random.randrange(n)
        elif strategy == "round_robin":
            # a random start, as the pool's (next() on the counter is atomic under the GIL)
            counter = itertools.count(random.randrange(n))
            self._pick = lambda: next(counter) % n
        else:
            raise ValueError(f"bare clients pick 'random' or 'round_robin', not {strategy!r}")

    def query(self, sql: str) -> Sequence[Sequence[Any]]:
        return self._clients[self._pick()].query(sql).result_rows

    def close(self) -> None:
        for client in self._clients:
            client.close()


def pool_arguments(strategy: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``get_pool`` keywords of a pool contender. ``share_state=False``: by default pools over
    the same replicas and balancing settings share their error counts and one health-probe
    worker that outlives ``close()`` (health and liveness settings are not part of that key), so
    a contender would inherit the errors of the one before it, and ``pool_random_no_checks``
    would be healed by the probes ``pool_random`` left running. Each run starts afresh."""
    return {"load_balancing": strategy, "share_state": False, **options}


class _Pool:
    def __init__(self, addresses: Sequence[str], strategy: str, options: Mapping[str, Any]) -> None:
        self._pool = clickhouse_lb.get_pool(list(addresses), **pool_arguments(strategy, options))

    def query(self, sql: str) -> Sequence[Sequence[Any]]:
        return self._pool.query(sql).result_rows

    def close(self) -> None:
        self._pool.close()


def open_target(contender: Contender, addresses: Sequence[str], haproxy: Any | None) -> Target:
    """A ready :class:`Target` for ``contender`` over the replicas at ``addresses``
    (``haproxy``: a started :class:`~headtohead.haproxy.HAProxy`, needed by HAProxy contenders)."""
    if contender.kind == "bare":
        return _Client(*_split(addresses[0]))
    if contender.kind == "bare_pick":
        assert contender.strategy is not None
        return _Picked(addresses, contender.strategy)
    if contender.kind == "pool":
        assert contender.strategy is not None
        return _Pool(addresses, contender.strategy, contender.options)
    if contender.kind == "haproxy":
        if haproxy is None or contender.profile is None:
            raise RuntimeError(f"{contender.name} needs HAProxy")
        return _Client(*haproxy.address(contender.profile))
    raise ValueError(f"unknown contender kind {contender.kind!r}")


def available(contender: Contender, haproxy_present: bool) -> str | None:
    """None when the contender can run here, else why not (an HAProxy contender without
    HAProxy)."""
    if contender.kind == "haproxy" and not haproxy_present:
        return "no HAProxy in this run: haproxy not on PATH, or --no-haproxy"
    return None
