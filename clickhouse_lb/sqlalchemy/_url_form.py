"""An engine URL that survives configparser: Alembic's ``config.set_main_option("sqlalchemy.url",
engine.url.render_as_string(hide_password=False))`` (not ``str(engine.url)``, which hides the
password as ``***``) reads ``%`` as interpolation syntax, and SQLAlchemy renders a query value
``host=ch-1:8123`` as ``host=ch-1%3A8123``. The dialects give their engine the same replicas in
the ``?host=ch-1&port=8123&host=ch-2&port=8124`` form (one ``port=`` per ``host=``, no ``:`` to
encode; :mod:`clickhouse_lb.sqlalchemy.url` reads it back to the same configuration)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.sqlalchemy._shared import ENGINE_ARGS

__all__ = ["give_percent_free_url", "percent_free_url"]

_HOST_PARAMETERS = ("host", "port", "alt_hosts", "priority")


def _rendered(url: URL) -> str:
    # The password is the user's to escape (as for any SQLAlchemy URL): only what the dialect's
    # host forms add is looked at.
    return url.set(password=None).render_as_string(hide_password=False)


def percent_free_url(url: URL, replicas: list[Replica]) -> URL:
    """``url`` with its hosts (authority, ``host=``, ``port=``, ``alt_hosts=``) written as
    ``host=``/``port=`` pairs when that removes a ``%`` from its rendering; ``url`` itself
    otherwise (an IPv6 host, say, whose ``:`` are encoded in any form)."""
    if "%" not in _rendered(url):
        return url
    pairs: list[tuple[str, str]] = []
    for replica in replicas:
        pairs += [("host", replica.host), ("port", str(replica.port))]
    if "priority" in url.query:  # one value per host, in order: a list's commas render as %2C
        pairs += [("priority", str(replica.priority)) for replica in replicas]
    # One port= per host=, in order: url.py pairs them back. The query keeps its other
    # parameters; host/port go last (SQLAlchemy keeps insertion order per key).
    # (URL.set leaves a field given None unchanged: the host goes through URL.create.)
    bare = URL.create(url.drivername, url.username, url.password, None, None, url.database, url.query)
    rewritten = bare.difference_update_query(_HOST_PARAMETERS).update_query_pairs(pairs)
    return rewritten if "%" not in _rendered(rewritten) else url


def give_percent_free_url(engine: Any) -> None:
    """A dialect's ``engine_created`` hook: the engine's URL in the form without ``%``, its
    replicas read as the dialect reads them (its own client's options)."""
    _, params = engine.dialect.create_connect_args(engine.url)
    engine.url = percent_free_url(engine.url, params[ENGINE_ARGS].config.replicas)
