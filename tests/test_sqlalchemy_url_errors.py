"""Host errors of a ``clickhousedb+lb://`` URL name the form for hosts with ports of their own,
``?host=ch-1:8123&host=ch-2:9000``: SQLAlchemy's own parser fails on ``ch-1:8123,ch-2:9000`` in
the host part with a message about int() that says nothing of it (docs/sqlalchemy.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.sqlalchemy.url import engine_args_from_url

FORM = "?host=ch-1:8123&host=ch-2:9000"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "sqlalchemy.md"


@pytest.mark.parametrize(
    "url",
    [
        "clickhousedb+lb://u:@/db",
        "clickhousedb+lb://u:@ch-1,,ch-2:8123/db",
        "clickhousedb+lb://u:@:8123/db",
        "clickhousedb+lb://u:@/db?port=8123",
        "clickhousedb+lb://u:@/db?host=a&host=b&port=1&port=2&port=3",
        "clickhousedb+lb://u:@/db?host=a:1&host=b&port=2&port=3",
    ],
)
def test_every_host_error_the_dialect_owns_names_the_per_host_port_form(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        engine_args_from_url(make_url(url))
    assert FORM in str(caught.value)


def test_sqlalchemys_own_failure_on_per_host_ports_is_what_the_docs_explain() -> None:
    with pytest.raises(ValueError, match="invalid literal for int") as caught:
        make_url("clickhousedb+lb://u:@ch-1:8123,ch-2:9000/db")
    assert not isinstance(caught.value, ConfigurationError)  # SQLAlchemy's, before the dialect
    docs = DOCS.read_text()
    top = docs[: docs.index("## URL forms")]  # where a user looks first
    assert str(caught.value) in top.replace("\n> ", " ")
    assert FORM in top


@pytest.mark.parametrize("host", ["[::1", "[10.0.0.5", "[db-1.example", "[::1]x", "[db-1.example]"])
@pytest.mark.parametrize("port", ["", "&port=8123"])
def test_a_malformed_bracketed_host_is_refused_as_written(host: str, port: str) -> None:
    """With or without port=: never cut to another host ('[::1' was taken as '::')."""
    with pytest.raises(ConfigurationError) as caught:
        engine_args_from_url(make_url(f"clickhousedb+lb://u:@/db?host={host}{port}"))
    assert f"Bad host {host!r}: expected [ipv6]:port" in str(caught.value)


@pytest.mark.parametrize("hosts", ["host=ch-1:8123", "host=ch-1:8123&host=[::1]:8124"])
def test_a_port_no_host_takes_is_refused(hosts: str) -> None:
    """One port= where every host= has a port of its own: used by nothing, so refused (as two
    port= values for such hosts are), naming it (docs/sqlalchemy.md: given a port both ways)."""
    with pytest.raises(ConfigurationError, match=r"port=9000 but every host= has a port of its own") as caught:
        engine_args_from_url(make_url(f"clickhousedb+lb://u:@/db?{hosts}&port=9000"))
    assert FORM in str(caught.value)


def test_one_port_for_the_hosts_without_one_still_works() -> None:
    args = engine_args_from_url(make_url("clickhousedb+lb://u:@/db?host=ch-1&host=ch-2:9000&host=[::1]&port=8124"))
    assert [r.address for r in args.config.replicas] == ["ch-1:8124", "ch-2:9000", "[::1]:8124"]
