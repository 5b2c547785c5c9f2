"""A ``clickhousedb+lb://`` engine URL survives being rendered and read back: by
``create_engine`` and by Alembic's configuration (configparser's BasicInterpolation, where a
``%`` starts an interpolation), and the ``port=`` form per host renders without any ``%``."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest
import sqlalchemy
from alembic.config import Config
from sqlalchemy import create_engine
from sqlalchemy.engine import URL, make_url

from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.sqlalchemy.url import engine_args_from_url

PORT_FORM = "clickhousedb+lb://default:s3cret@/analytics?host=ch-1&host=ch-2&host=10.0.0.3&port=8123&port=8124&port=8125"
HOST_PORT_FORM = "clickhousedb+lb://default:s3cret@/analytics?host=ch-1:8123&host=ch-2:8124&host=10.0.0.3:8125"
EXPECTED = ["ch-1:8123", "ch-2:8124", "10.0.0.3:8125"]


def addresses(url: str | URL) -> list[str]:
    return [r.address for r in engine_args_from_url(make_url(url)).config.replicas]


def rendered(url: str) -> str:
    """An engine's URL as given back to Alembic (``str(engine.url)`` would mask the password)."""
    engine = create_engine(url)
    return engine.url.render_as_string(hide_password=False)


def test_the_port_form_gives_each_host_its_port() -> None:
    assert addresses(PORT_FORM) == EXPECTED
    assert addresses(HOST_PORT_FORM) == EXPECTED


def test_the_port_form_renders_without_percent_and_survives_alembics_config() -> None:
    text = rendered(PORT_FORM)
    assert "%" not in text
    config = Config()
    config.set_main_option("sqlalchemy.url", text)
    read_back = config.get_main_option("sqlalchemy.url")
    assert read_back == text
    assert addresses(read_back) == EXPECTED
    assert create_engine(read_back).url.password == "s3cret"


def test_the_engine_renders_the_host_port_form_without_percent_for_configparser() -> None:
    # make_url alone renders host=ch-1:8123 as host=ch-1%3A8123, which configparser refuses;
    # the engine's URL is given the port= form instead (clickhouse_lb.sqlalchemy._url_form).
    assert "%3A" in make_url(HOST_PORT_FORM).render_as_string(hide_password=False)
    text = rendered(HOST_PORT_FORM)
    assert "%" not in text
    config = Config()
    config.set_main_option("sqlalchemy.url", text)
    assert addresses(config.get_main_option("sqlalchemy.url")) == EXPECTED


def test_an_authority_and_alt_hosts_keep_their_order_in_the_rendered_form() -> None:
    url = "clickhousedb+lb://u:p@ch-1:8123/db?host=ch-2:8124&alt_hosts=ch-3:8125&priority=0,1,1&load_balancing=in_order"
    text = rendered(url)
    assert "%" not in text
    assert addresses(text) == ["ch-1:8123", "ch-2:8124", "ch-3:8125"]
    assert engine_args_from_url(make_url(text)).config.replicas == engine_args_from_url(make_url(url)).config.replicas


def test_rendered_urls_go_back_into_create_engine_unchanged() -> None:
    for url in (PORT_FORM, HOST_PORT_FORM, "clickhousedb+lb://u:p%40ss@ch-1,ch-2:8123/db?load_balancing=in_order"):
        text = rendered(url)
        assert rendered(text) == text
        assert addresses(text) == addresses(url)


def test_an_ini_file_with_the_port_form_reads_back_as_written(tmp_path: object) -> None:
    parser = configparser.ConfigParser()  # BasicInterpolation, as alembic.ini is read
    parser.read_string(f"[alembic]\nsqlalchemy.url = {rendered(PORT_FORM)}\n")
    assert addresses(parser["alembic"]["sqlalchemy.url"]) == EXPECTED


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("clickhousedb+lb://u@/db?port=8123", "no host="),
        ("clickhousedb+lb://u@/db?host=a&host=b&host=c&port=1&port=2", "2 port= values for 3 host="),
        ("clickhousedb+lb://u@/db?host=a:1&host=b&port=8123&port=8124", "has a port and is also given"),
        ("clickhousedb+lb://u@/db?host=a&port=http", "Bad port"),
    ],
)
def test_bad_port_forms_are_refused_naming_them(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        engine_args_from_url(make_url(url))


def test_ipv6_hosts_take_their_port_too() -> None:
    # (an IPv6 literal has ':' of its own, which SQLAlchemy percent-encodes: double the '%' for configparser)
    assert addresses("clickhousedb+lb://u@/db?host=::1&host=[::2]&port=8123&port=8124") == ["[::1]:8123", "[::2]:8124"]


def test_one_port_for_all_hosts_leaves_a_hosts_own_port() -> None:
    assert addresses("clickhousedb+lb://u@/db?host=a&host=b:9000&port=8123") == ["a:8123", "b:9000"]


DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_docs_hand_alembic_the_url_with_its_password() -> None:
    """str(engine.url) masks the password as *** under SQLAlchemy 2: Alembic given it fails with
    AUTHENTICATION_FAILED. Every set_main_option("sqlalchemy.url", ...) the docs suggest renders
    the password."""
    if sqlalchemy.__version__ >= "2":  # (1.4's str() shows the password: the compat job)
        assert "***" in str(create_engine(PORT_FORM).url)
    suggested = [
        (page.name, match.group(1))
        for page in sorted(DOCS.rglob("*.md"))
        for match in re.finditer(r'set_main_option\("sqlalchemy\.url", ([^`\n]+)\)', page.read_text())
    ]
    assert suggested, "docs/sqlalchemy.md's Alembic section shows the call"
    for page, argument in suggested:
        assert "render_as_string(hide_password=False)" in argument, (page, argument)
