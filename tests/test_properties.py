"""Property-based hardening (Hypothesis): whatever hosts, DSNs, SQLAlchemy URLs and option
sets a user writes, construction ends quickly in a pool or a documented error, and no message
shows the password.

CI runs the ``ci`` profile (few examples, a few seconds); ``HYPOTHESIS_PROFILE=deep`` explores
more.
"""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clickhouse_lb import ConfigurationError, get_pool
from clickhouse_lb._redact import redact

settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("deep", max_examples=3000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: A secret no generated text can contain by accident, with every character that breaks URLs.
SECRETS = st.sampled_from(["Zq9@pw#x?y/z%25:w", "Zq9secretXY", "Zq9/at@hash#", "Zq9:colon:", "Zq9%41pct"])
#: Anything a careless user may write where a host goes.
HOST_TEXT = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"[a-z0-9.\-_:\[\]%@?#=/ ]{0,30}", fullmatch=True),
    st.sampled_from(["h:8123:9", "[::1]:8123", "::1", "10.0.0.1:70000", "ch-1:¹²", "ch\r\n1", "ch\u200b1"]),
)
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
OPTION_NAMES = st.sampled_from([
    "load_balancing", "load_balancing_first_offset", "local_hostname", "distributed_replica_error_half_life",
    "distributed_replica_error_cap", "distributed_replica_max_ignored_errors", "connections_with_failover_max_tries",
    "connect_timeout_with_failover_ms", "failover_backoff_ms", "failover_timeout", "auto_insert_deduplication_token",
    "share_state", "compress", "connect_timeout", "send_receive_timeout", "settings", "username", "database",
    "query_limit", "secure", "verify", "interface", "listeners", "dsn", "hosts", "bogus_option",
])

#: What construction may raise: the documented ConfigurationError (a ValueError) and nothing else.
ALLOWED = (ConfigurationError,)
#: No construction is I/O. A third of clickhouse-connect's 10 s connect timeout, the shortest wait
#: of a construction that connected to an unreachable host (a healthy one takes milliseconds).
BOUND_SECONDS = 3.0


def _hidden(text: str, secret: str) -> None:
    assert secret not in text, text
    assert quote(secret, safe="") not in text, text


def _construct(secret: str, **kwargs: Any) -> None:
    started = time.monotonic()
    try:
        pool = get_pool(password=secret, **{"share_state": False, "connect_on_create": False, **kwargs})
    except ALLOWED as exc:
        _hidden(str(exc), secret)
    else:
        assert secret not in repr(pool)
        assert secret not in repr(pool.config)
        pool.close()
    assert time.monotonic() - started < BOUND_SECONDS


@given(hosts=st.one_of(HOST_TEXT, st.lists(HOST_TEXT, max_size=4)), secret=SECRETS)
def test_any_hosts(hosts: Any, secret: str) -> None:
    _construct(secret, hosts=hosts)


@given(
    userinfo=st.sampled_from(["raw", "encoded", "none"]),
    hosts=st.lists(HOST_TEXT, min_size=0, max_size=3),
    query=st.lists(st.tuples(OPTION_NAMES, st.text(max_size=8)), max_size=3),
    path=st.text(max_size=8),
    scheme=st.sampled_from(["clickhouse", "https", "mysql", "", "clickhouse+http"]),
    secret=SECRETS,
)
def test_any_dsn(
    *,
    userinfo: str, hosts: list[str], query: list[tuple[str, str]], path: str, scheme: str, secret: str
) -> None:
    password = {"raw": secret, "encoded": quote(secret, safe=""), "none": ""}[userinfo]
    auth = f"user:{password}@" if password else ""
    params = "&".join(f"{k}={v}" for k, v in query)
    dsn = f"{scheme}://{auth}{','.join(hosts)}/{path}" + (f"?{params}" if params else "")
    started = time.monotonic()
    try:
        get_pool(dsn=dsn, share_state=False, connect_on_create=False).close()
    except ALLOWED as exc:
        _hidden(str(exc), secret)
    assert time.monotonic() - started < BOUND_SECONDS


@given(options=st.dictionaries(OPTION_NAMES, VALUES, max_size=4), secret=SECRETS)
def test_any_option_set(options: dict[str, Any], secret: str) -> None:
    options.setdefault("hosts", "ch-1:8123,ch-2:8123")
    if "dsn" in options and "hosts" in options and options["dsn"] is None:
        del options["dsn"]
    _construct(secret, **options)


@given(
    hosts=st.lists(HOST_TEXT, min_size=1, max_size=3),
    query=st.lists(st.tuples(OPTION_NAMES, st.text(max_size=8)), max_size=3),
    secret=SECRETS,
)
def test_any_sqlalchemy_url(hosts: list[str], query: list[tuple[str, str]], secret: str) -> None:
    pytest.importorskip("sqlalchemy")
    from sqlalchemy.engine import make_url

    from clickhouse_lb.sqlalchemy.url import engine_args_from_url

    params = "&".join(f"{k}={quote(v, safe='')}" for k, v in query)
    text = f"clickhousedb+lb://user:{quote(secret, safe='')}@{','.join(quote(h, safe=':[]') for h in hosts)}/db"
    started = time.monotonic()
    try:
        url = make_url(text + (f"?{params}" if params else ""))
    except Exception:  # SQLAlchemy's own URL parser refusing it is SQLAlchemy's business
        return
    try:
        engine_args_from_url(url)
    except ALLOWED as exc:
        _hidden(str(exc), secret)
    assert time.monotonic() - started < BOUND_SECONDS


@given(text=st.text(max_size=40), secret=SECRETS, form=st.integers(min_value=0, max_value=5))
def test_redact_masks_a_secret_in_any_surrounding_text(text: str, secret: str, form: int) -> None:
    embedded = [
        f"clickhouse://user:{secret}@h1/db",
        f"password={quote(secret, safe='')}",
        f"{{'password': '{secret}'}}",
        f'"access_token": "{secret}"',
        f"Authorization: Bearer {quote(secret, safe='')}",
        f"http://h/?user=u&password={quote(secret, safe='')}&x=1",
    ][form]
    shown = redact(f"{text} {embedded} {text}")
    _hidden(shown, secret)
