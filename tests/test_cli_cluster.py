"""``clickhouse-lb cluster`` without a cluster: its arguments, and the DSN and URL it prints
parse back, through the library's own parsers, to the hosts, user, password and database."""

from __future__ import annotations

import pytest

from clickhouse_lb.cli import _cluster
from clickhouse_lb.cli._main import build_parser, main
from clickhouse_lb.config.replicas import parse_dsn
from clickhouse_lb.sqlalchemy.url import engine_args_from_url

HOSTS = ["127.0.0.11:40001", "127.0.0.12:40002", "127.0.0.13:40003"]
SHARED = ["127.0.0.11:40000", "127.0.0.12:40000", "127.0.0.13:40000"]


def url_parts(url: str) -> tuple[list[str], str | None, str | None, str | None, bool]:
    from sqlalchemy.engine import make_url

    args = engine_args_from_url(make_url(url))
    config = args.config
    options = config.client_options
    return ([r.address for r in config.replicas], options.get("username"), options.get("password"),
            options.get("database"), bool(options.get("secure")))


@pytest.mark.parametrize("hosts", [HOSTS, SHARED], ids=["own ports", "shared port"])
def test_dsn_and_url_parse_back_to_what_the_cluster_serves(hosts: list[str]) -> None:
    found = _cluster.endpoints(hosts, user="app", password="p@ss:w/rd?#", database="analytics")
    dsn = parse_dsn(found.dsn)
    assert [r.address for r in dsn.replicas] == hosts
    assert (dsn.username, dsn.password, dsn.database, dsn.secure) == ("app", "p@ss:w/rd?#", "analytics", False)
    assert url_parts(found.url) == (hosts, "app", "p@ss:w/rd?#", "analytics", False)
    assert found.as_dict() == {"hosts": hosts, "dsn": found.dsn, "url": found.url}


def test_shared_port_is_written_once_in_the_url() -> None:
    found = _cluster.endpoints(SHARED)
    assert found.url == "clickhousedb+lb://127.0.0.11,127.0.0.12,127.0.0.13:40000/default"
    assert found.dsn == "clickhouse://127.0.0.11:40000,127.0.0.12:40000,127.0.0.13:40000/default"


def test_tls_endpoints_verify_against_the_test_ca() -> None:
    found = _cluster.endpoints(HOSTS, user="default", ca_cert="/tmp/x/tls/ca.pem")
    dsn = parse_dsn(found.dsn)
    assert dsn.secure
    assert dsn.options == {"ca_cert": "/tmp/x/tls/ca.pem"}
    assert url_parts(found.url) == (HOSTS, "default", None, "default", True)
    from sqlalchemy.engine import make_url

    assert engine_args_from_url(make_url(found.url)).config.client_options["ca_cert"] == "/tmp/x/tls/ca.pem"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "0"], "expected 1 to 9 replicas, not 0"),
        (["--replicas", "three"], "expected an integer, not 'three'"),
        (["--user", "bad name:pw"], "expected NAME:PASSWORD"),
        (["--database", "drop;table"], "expected a database name"),
    ],
)
def test_bad_arguments_name_the_value(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["cluster", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_user_password_may_hold_colons_and_is_never_echoed_on_bad_names(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["cluster", "--user", "app:a:b", "--database", "analytics", "--json"])
    options = _cluster.options_from_args(args)
    assert (options.user, options.password, options.database, options.json) == ("app", "a:b", "analytics", True)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cluster", "--user", "b@d:secret-pw"])
    assert "secret-pw" not in capsys.readouterr().err


def test_cluster_without_chdb_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(_cluster, "chdb_available", lambda: False)
    assert main(["cluster"]) == 2
    err = capsys.readouterr().err
    assert "clickhouse-lb cluster runs a local cluster" in err
    assert "pip install '.[local]'" in err


class BrokenCluster:
    """A cluster whose start fails the way a replica that does not come up does."""

    closed = 0

    def __init__(self, error: Exception) -> None:
        self.error = error

    def start(self) -> None:
        raise self.error

    def close(self) -> None:
        BrokenCluster.closed += 1


@pytest.mark.parametrize(
    ("error", "said"),
    [
        ("cluster", "the local cluster failed: replicas r2 not ready after 60s"),
        ("other", "starting the cluster failed (RuntimeError): boom password=***"),
    ],
)
def test_a_cluster_that_fails_to_start_is_said_and_closed(
    error: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from clickhouse_lb.testing import ClusterError

    exc = ClusterError("replicas r2 not ready after 60s") if error == "cluster" else RuntimeError("boom password=x")
    monkeypatch.setattr(_cluster, "chdb_available", lambda: True)
    monkeypatch.setattr(_cluster, "_new_cluster", lambda options: BrokenCluster(exc))
    before = BrokenCluster.closed
    assert main(["cluster"]) == 1
    assert BrokenCluster.closed == before + 1
    captured = capsys.readouterr()
    assert said in captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""
