"""Messages a person can read: the creation check's error, unknown names, log lines.

A replica failure is described by its kind and root cause in a few hundred characters, never
with the request's URL query (the pool's settings, the query id); the creation check says it
was the creation check and mentions no write; an unknown name gets at most five suggestions
and the configuration reference; a failover with logging unconfigured prints one line.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import urllib3
from clickhouse_connect.driver.exceptions import OperationalError

from clickhouse_lb import AllReplicasUnavailableError, ConfigurationError, get_pool
from clickhouse_lb._redact import BRIEF_LIMIT, brief
from clickhouse_lb.config.health import parse_health_settings
from clickhouse_lb.errors import CONFIGURATION_REFERENCE

from .fakes import FakeCluster, make_pool

ROOT = Path(__file__).resolve().parents[1]
SETTINGS_QUERY = "/?date_time_input_format=best_effort&cast_string_to_dynamic_user_inference=1&query_id=0f3a"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def refused_as_clickhouse_connect_raises_it() -> OperationalError:
    """A real refused connection, wrapped as clickhouse-connect's HTTP client wraps it: the
    whole MaxRetryError text (URL with every setting in its query) inside the message."""
    port = closed_port()
    http = urllib3.PoolManager(retries=urllib3.Retry(total=0))
    try:
        http.request("GET", f"http://127.0.0.1:{port}{SETTINGS_QUERY}")
    except urllib3.exceptions.MaxRetryError as ex:
        try:
            raise OperationalError(f"Error {ex} executing HTTP request attempt 1 (http://127.0.0.1:{port})") from ex
        except OperationalError as wrapped:
            return wrapped
    raise AssertionError("the closed port accepted a connection")


def test_the_raw_error_is_what_the_issue_shows() -> None:
    text = str(refused_as_clickhouse_connect_raises_it())
    assert "date_time_input_format" in text
    assert "Max retries exceeded" in text


def test_brief_drops_url_queries_and_connection_reprs_and_caps_the_length() -> None:
    text = ("Error _TrackedHTTPConnectionPool(host='ch-1', port=8123): Max retries exceeded with url: "
            f"{SETTINGS_QUERY} (Caused by NewConnectionError(\"_TrackedHTTPConnection(host='ch-1', port=8123): "
            "refused\")) executing HTTP request attempt 1 (http://user:pw@ch-1:8123/?password=x&a=b)")
    short = brief(text)
    assert "date_time_input_format" not in short
    assert "password=x" not in short
    assert ":pw@" not in short
    assert "url: / (Caused by" in short
    assert "ch-1:8123" in short
    assert "refused" in short
    assert len(brief("x" * 10_000)) == BRIEF_LIMIT
    assert "\n" not in brief("line one\nline two")


def test_creation_check_error_says_what_failed_per_replica_and_no_write() -> None:
    cluster = FakeCluster("a", "b", "c")
    for replica in cluster.replicas.values():
        replica.fail_creation = refused_as_clickhouse_connect_raises_it
    pool = make_pool(cluster, connections_with_failover_max_tries=1)
    with pytest.raises(AllReplicasUnavailableError) as caught:
        pool.connect()
    message = str(caught.value)
    assert caught.value.operation == "connect"
    first, *per_replica = message.splitlines()
    assert first.startswith("The pool's creation check failed: none of its 3 replicas answered")
    assert "connect_on_create=False" in first
    assert "write" not in message.lower()
    assert [line.split(":")[0].strip() for line in per_replica] == ["a", "b", "c"]
    for line in per_replica:
        assert "Connection refused" in line
        assert "date_time_input_format" not in line
        assert "query_id" not in line
        assert len(line) <= BRIEF_LIMIT + 10


def test_get_pool_over_unreachable_hosts_raises_the_creation_check_error() -> None:
    hosts = [f"127.0.0.1:{closed_port()}", f"127.0.0.1:{closed_port()}"]
    with pytest.raises(AllReplicasUnavailableError) as caught:
        get_pool(hosts, health_check_interval_ms=0, connections_with_failover_max_tries=1)
    message = str(caught.value)
    assert "creation check failed" in message
    assert "write" not in message.lower()
    assert "query_id" not in message
    assert "Max retries" not in message
    assert all(len(line) <= BRIEF_LIMIT + 30 for line in message.splitlines()[1:])


def test_a_failed_read_mentions_no_write() -> None:
    cluster = FakeCluster("a", "b")
    for replica in cluster.replicas.values():
        replica.outcomes = [refused_as_clickhouse_connect_raises_it]
    pool = make_pool(cluster, connections_with_failover_max_tries=1)
    with pytest.raises(AllReplicasUnavailableError) as caught:
        pool.query("SELECT 1")
    assert str(caught.value).startswith("All 2 replicas are unavailable")
    assert "write" not in str(caught.value).lower()


def test_a_failed_unsent_write_still_says_it_was_not_applied() -> None:
    cluster = FakeCluster("a", "b")
    for replica in cluster.replicas.values():
        replica.outcomes = [refused_as_clickhouse_connect_raises_it]
    pool = make_pool(cluster, connections_with_failover_max_tries=1)
    with pytest.raises(AllReplicasUnavailableError) as caught:
        pool.command("INSERT INTO t VALUES (1)")
    assert str(caught.value).endswith("The write was not applied: no replica received it.")


def test_did_you_mean_lists_at_most_five_names_and_the_reference() -> None:
    with pytest.raises(ConfigurationError) as caught:
        get_pool(["a:8123"], load_balancin="random", connect_on_create=False)
    message = str(caught.value)
    assert message.startswith("Unknown option 'load_balancin'. Did you mean load_balancing")
    suggested = message.split("Did you mean ")[1].split("?", maxsplit=1)[0].split(", ")
    assert 1 <= len(suggested) <= 5
    assert CONFIGURATION_REFERENCE in message
    assert CONFIGURATION_REFERENCE.endswith("docs/configuration.md")
    assert "access_token" not in message
    assert "Valid:" not in message
    assert len(message) < 300


def test_an_unknown_name_far_from_any_lists_a_small_set_whole() -> None:
    with pytest.raises(ConfigurationError, match=r"Valid: health_check_delay_interval_ms, .*health_check_timeout_ms\."):
        parse_health_settings({"zzz": 1})
    with pytest.raises(ConfigurationError) as caught:
        get_pool(["a:8123"], zzzzzz=1, connect_on_create=False)
    assert "Did you mean" not in str(caught.value)
    assert "Valid:" not in str(caught.value)
    assert CONFIGURATION_REFERENCE in str(caught.value)


def test_failover_log_line_names_the_replica_and_the_error_not_the_url(caplog: pytest.LogCaptureFixture) -> None:
    cluster = FakeCluster("a", "b")
    cluster["a"].outcomes = [refused_as_clickhouse_connect_raises_it, "ok"]
    pool = make_pool(cluster, load_balancing="in_order")
    with caplog.at_level(logging.WARNING, logger="clickhouse_lb"):
        pool.query("SELECT 1")
    (record,) = [r for r in caplog.records if "failing over" in r.getMessage()]
    line = record.getMessage()
    assert line.startswith("query failed on replica a:8123 (attempt 1/")
    assert "ConnectionRefusedError" in line
    assert line.endswith("failing over to b:8123")
    assert "date_time_input_format" not in line
    assert "url:" not in line
    assert len(line) < 200


FAILOVER_UNCONFIGURED = """
from tests.fakes import FakeCluster, make_pool
from tests.test_messages import refused_as_clickhouse_connect_raises_it
cluster = FakeCluster("a", "b")
cluster["a"].outcomes = [refused_as_clickhouse_connect_raises_it, "ok"]
pool = make_pool(cluster, load_balancing="in_order")
pool.query("SELECT 1")
pool.close()
"""


def test_a_failover_with_logging_unconfigured_prints_one_line() -> None:
    """Python's last-resort handler prints WARNING records' messages: one failover, one line."""
    done = subprocess.run([sys.executable, "-c", FAILOVER_UNCONFIGURED], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("query failed on replica a:8123")
    assert "date_time_input_format" not in lines[0]


def test_discovery_failure_names_each_seed_and_its_error_briefly() -> None:
    from clickhouse_lb.config.discovery import DiscoveryError
    from clickhouse_lb.config.replicas import Replica
    from clickhouse_lb.core.discovery import discover

    def fetch(seed: Replica) -> None:
        raise refused_as_clickhouse_connect_raises_it()

    with pytest.raises(DiscoveryError) as caught:
        discover([Replica("seed-1", 8123), Replica("seed-2", 8123)], fetch)
    message = str(caught.value)
    assert "seed-1:8123: OperationalError: ConnectionRefusedError" in message
    assert "seed-2:8123: OperationalError: ConnectionRefusedError" in message
    assert "date_time_input_format" not in message
    assert len(message) < 2 * BRIEF_LIMIT


async def test_the_async_pools_creation_check_error_is_the_same() -> None:
    from .test_aio import AsyncFakeCluster
    from .test_aio import make_pool as make_async_pool

    cluster = AsyncFakeCluster("a", "b")
    for replica in cluster.replicas.values():
        replica.fail_creation = refused_as_clickhouse_connect_raises_it
    pool = make_async_pool(cluster, connections_with_failover_max_tries=1)
    try:
        with pytest.raises(AllReplicasUnavailableError) as caught:
            await pool.connect()
    finally:
        await pool.close()
    assert caught.value.operation == "connect"
    assert str(caught.value).startswith("The pool's creation check failed: none of its 2 replicas answered")
    assert "write" not in str(caught.value).lower()
