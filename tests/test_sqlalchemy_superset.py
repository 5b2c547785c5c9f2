"""Superset picks its "ClickHouse Connect" engine spec for a ``clickhousedb+lb`` URL.

Superset is too heavy to install for this; the test applies its lookup rules as written in
apache/superset:

- ``superset/db_engine_specs/__init__.py``: ``get_engine_spec(backend, driver)`` returns the
  first loaded spec whose ``supports_backend(backend, driver)`` is true, then (driver ignored)
  the first whose ``supports_backend(backend)`` is, else ``BaseEngineSpec``; ``Database``
  calls it with ``url.get_backend_name()`` and ``url.get_driver_name()``.
  ``get_available_engine_specs()`` lists, for each spec, the drivers of the installed
  ``sqlalchemy.dialects`` entry points whose dialect ``name`` is the spec's ``engine``.
- ``superset/db_engine_specs/base.py``: ``supports_backend`` is true when the backend is the
  spec's ``engine`` or one of its ``engine_aliases`` and either the spec declares no
  ``drivers`` or the driver is one of them.
- ``superset/db_engine_specs/clickhouse.py``: ``ClickHouseEngineSpec`` (``engine =
  "clickhouse"``, the clickhouse-sqlalchemy connector) and ``ClickHouseConnectEngineSpec``
  (``engine = "clickhousedb"``, ``default_driver = "connect"``, no ``drivers``, no
  ``engine_aliases``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points

from sqlalchemy.engine import make_url

from clickhouse_lb.sqlalchemy import ClickHouseLBDialect


@dataclass(frozen=True)
class Spec:
    """The attributes of a Superset engine spec that its lookup reads."""

    name: str
    engine: str
    engine_aliases: frozenset[str] = frozenset()
    drivers: dict[str, str] = field(default_factory=dict)

    def supports_backend(self, backend: str, driver: str | None = None) -> bool:
        if backend != self.engine and backend not in self.engine_aliases:
            return False
        if not self.drivers or driver is None:
            return True
        return driver in self.drivers


BASE = Spec("BaseEngineSpec", "")
SPECS = [
    Spec("PostgresEngineSpec", "postgresql", frozenset({"postgres"}), {"psycopg2": "", "asyncpg": ""}),
    Spec("ClickHouseEngineSpec", "clickhouse"),
    Spec("ClickHouseConnectEngineSpec", "clickhousedb"),
    Spec("MySQLEngineSpec", "mysql", drivers={"mysqldb": "", "pymysql": ""}),
]


def get_engine_spec(backend: str, driver: str | None = None) -> Spec:
    if driver is not None:
        for spec in SPECS:
            if spec.supports_backend(backend, driver):
                return spec
    for spec in SPECS:
        if spec.supports_backend(backend):
            return spec
    return BASE


def spec_for(uri: str) -> str:
    url = make_url(uri)
    return get_engine_spec(url.get_backend_name(), url.get_driver_name()).name


def test_every_documented_url_form_gets_the_clickhouse_connect_spec() -> None:
    for uri in [
        "clickhousedb+lb://user:pw@/db?host=ch-1:8123&host=ch-2:8123",
        "clickhousedb+lb://user:pw@ch-1,ch-2,ch-3:8123/db",
        "clickhousedb+lb://user:pw@ch-1:8123/db?alt_hosts=ch-2:8123,ch-3:8123&secure=true",
    ]:
        assert spec_for(uri) == "ClickHouseConnectEngineSpec"


def test_the_rules_reproduce_superset_for_known_urls() -> None:
    assert spec_for("clickhousedb://u@ch-1/db") == "ClickHouseConnectEngineSpec"
    assert spec_for("clickhousedb+connect://u@ch-1/db") == "ClickHouseConnectEngineSpec"
    assert spec_for("clickhouse+native://u@ch-1/db") == "ClickHouseEngineSpec"
    assert spec_for("postgresql+psycopg2://u@h/db") == "PostgresEngineSpec"
    assert spec_for("nosuchdb+anydriver://u@h/db") == "BaseEngineSpec"


def test_superset_lists_our_driver_under_the_clickhouse_connect_spec() -> None:
    """get_available_engine_specs(): backend = the entry point dialect's ``name``, driver its
    ``driver``; the spec whose ``engine`` is that backend shows the driver as installed."""
    drivers: dict[str, set[str]] = {}
    for ep in entry_points(group="sqlalchemy.dialects"):
        if ep.name == "clickhousedb.lb":
            dialect = ep.load()
            assert dialect is ClickHouseLBDialect
            drivers.setdefault(dialect.name, set()).add(dialect.driver)
    clickhouse_connect_spec = next(s for s in SPECS if s.name == "ClickHouseConnectEngineSpec")
    assert "lb" in drivers[clickhouse_connect_spec.engine]


def test_what_superset_shows_as_backend_and_driver() -> None:
    """Superset's Database.backend / .driver (the database list's Backend column, and
    ``GET /api/v1/database/<id>``) are the URL's ``get_backend_name()`` / ``get_driver_name()``;
    docs/sqlalchemy.md tells users to look for these to check that the dialect is in use."""
    from sqlalchemy import create_engine

    engine = create_engine("clickhousedb+lb://user:pw@ch-1,ch-2,ch-3:8123/db")
    assert (engine.url.get_backend_name(), engine.url.get_driver_name()) == ("clickhousedb", "lb")
    assert (engine.dialect.name, engine.dialect.driver) == ("clickhousedb", "lb")
    assert isinstance(engine.dialect, ClickHouseLBDialect)
