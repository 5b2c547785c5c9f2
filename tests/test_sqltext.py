"""The local replica reads request SQL in linear time (clickhouse_lb.testing._sqltext).

Python's ``re`` holds the GIL for a whole match: a pattern that backtracks exponentially on
some statement freezes every thread of the replica, its ``/ping`` answers included. Before
this module, ``INSERT ... FORMAT`` detection took 5.6 s on a CREATE statement indented by 24
spaces (the way clickhouse-connect's suite writes them) and the replication classifier 64 s on 26
block comments; on the first five inputs below the former patterns take 1.5 to 12 s each.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import time
from collections.abc import Callable

import pytest

from clickhouse_lb import testing
from clickhouse_lb.testing._engine import ClickHouseError
from clickhouse_lb.testing._sqltext import (
    INSERT_HEAD_LIMIT,
    exists_by_catalog,
    first_keyword,
    format_tail,
    mentions_temporary,
    split_statement,
    use_target,
    without_format_tail,
)

# Inputs that made the former patterns backtrack: long whitespace runs, runs of comments, and
# trailing whitespace after the part a pattern looks for, each followed by text that fails it.
_ADVERSARIAL = [
    # Exponential before: clickhouse-connect's indented statement (5.6 s), a run of comments.
    "\n" + " " * 24 + "CREATE TEMPORARY TABLE t (a String)",
    "/* c */ " * 21 + "SET x = 1",
    # Polynomial before (seconds at these sizes); linear now, so the large ones are cheap too.
    "SELECT 1 FORMAT TSV" + " " * 10000 + "x",
    "USE db" + " " * 800 + "x",
    "EXISTS TABLE `a*`" + " " * 800 + "x",
    "EXISTS TABLE `a*` FORMAT TSV" + " " * 1500 + ";" + " " * 1500 + "x",
    "\n" + " " * 5000 + "CREATE TEMPORARY TABLE t (a String)",
    "/* c */" * 2000 + "x",
    "-- c\n" * 2000 + "x",
    "INSERT INTO t " + " " * 5000 + "x",
]


def _patterns() -> list[tuple[str, re.Pattern[str] | re.Pattern[bytes]]]:
    """Every compiled pattern of the local replica's modules (the request path and replication)."""
    found: list[tuple[str, re.Pattern[str] | re.Pattern[bytes]]] = []
    for info in pkgutil.iter_modules(testing.__path__, "clickhouse_lb.testing."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern):
                found.append((f"{module.__name__}.{name}", value))
    return found


def _cpu_seconds(work: Callable[[], object]) -> float:
    """CPU time of ``work`` (the process's: waiting for a CPU on a loaded machine does not count)."""
    started = time.process_time()
    work()
    return time.process_time() - started


@pytest.mark.parametrize(("name", "pattern"), _patterns(), ids=lambda v: v if isinstance(v, str) else "")
def test_patterns_take_linear_time_on_adversarial_text(name: str, pattern: re.Pattern[str] | re.Pattern[bytes]) -> None:
    # A linear pattern is done with each input (at most ~10 KB) within 10 ms of CPU; the former
    # patterns took 1.5 s to 12 s on each of the first five (wall time at a load of 17-30).
    for text in _ADVERSARIAL:
        subject: str | bytes = text.encode() if isinstance(pattern.pattern, bytes) else text
        spent = _cpu_seconds(lambda s=subject: (pattern.match(s), pattern.search(s)))  # type: ignore[arg-type,misc]
        assert spent < 0.25, f"{name} took {spent:.2f}s of CPU on {text[:40]!r}..."


def test_functions_take_linear_time_on_adversarial_text() -> None:
    def work() -> None:
        for text in _ADVERSARIAL:
            first_keyword(text)
            use_target(text)
            exists_by_catalog(text)
            format_tail(text)
            mentions_temporary(text)
            split_statement(text, b"")
            split_statement(None, text.encode())

    assert _cpu_seconds(work) < 1.0


def test_a_big_insert_values_costs_a_few_passes_over_its_text() -> None:
    # 11 MB of VALUES: the former regexes scanned it whole three times (INSERT ... FORMAT, FORMAT
    # tail, TEMPORARY), 33 times the CPU of decoding and lower-casing it once, with the
    # GIL held. Now 1.2 times (the decode and the lower-casing are most of it).
    sql = "INSERT INTO t VALUES " + "(1, 'abcdefgh')," * 700_000
    data = sql.encode()
    reference = min(_cpu_seconds(lambda: (data.decode(), sql.lower())) for _ in range(3))
    results: list[object] = []

    def read() -> None:
        statement = split_statement(None, data)
        results[:] = [
            statement.insert_stmt,
            format_tail(statement.sql),
            mentions_temporary(statement.sql),
            first_keyword(statement.sql),
            exists_by_catalog(statement.sql),
        ]

    spent = min(_cpu_seconds(read) for _ in range(3))
    assert results == [None, None, False, "INSERT", None]
    assert spent < 10 * reference, f"{spent:.3f}s of CPU; decoding and lower-casing it once: {reference:.3f}s"


def test_insert_format_is_looked_for_in_the_statements_head_only() -> None:
    data = b"1,2\n" * 100_000
    long_columns = "INSERT INTO t (" + ", ".join(f"c{i}" for i in range(1000)) + ") FORMAT CSV"
    statement = split_statement(long_columns, data)
    assert (statement.insert_format, statement.data) == ("CSV", data)
    # Beyond max_query_size the statement is not split (the engine reads it, or refuses it),
    # also when the limit cuts through the format's name.
    for spaces in (INSERT_HEAD_LIMIT - 20, INSERT_HEAD_LIMIT - 30, INSERT_HEAD_LIMIT):
        stmt = b"INSERT INTO t " + b" " * spaces + b"FORMAT JSONEachRow\n{}"
        assert split_statement(None, stmt).insert_stmt is None
    near = b"INSERT INTO t " + b" " * (INSERT_HEAD_LIMIT - 100) + b"FORMAT JSONEachRow\n{}"
    assert split_statement(None, near).insert_format == "JSONEachRow"


def test_indented_create_is_one_statement_without_data() -> None:
    sql = "\n" + " " * 24 + "CREATE\n" + " " * 24 + "TEMPORARY TABLE t\n    (\n        a String\n    )"
    statement = split_statement(None, sql.encode())
    assert statement.sql == sql
    assert statement.insert_stmt is None
    assert first_keyword(sql) == "CREATE"


@pytest.mark.parametrize(
    ("query", "body", "stmt", "fmt", "data"),
    [
        ("INSERT INTO t (a, b) FORMAT Native", b"\x01\x02", "INSERT INTO t (a, b)", "Native", b"\x01\x02"),
        (None, b"INSERT INTO t FORMAT CSV\n1,2\n", "INSERT INTO t", "CSV", b"1,2\n"),
        (
            None,
            b"  -- note\n/* a */ /* b */ insert into t format TSV\r\n1\t2\n",
            "-- note\n/* a */ /* b */ insert into t",
            "TSV",
            b"1\t2\n",
        ),
        ("INSERT INTO t FORMAT JSONEachRow", b'{"a": 1}', "INSERT INTO t", "JSONEachRow", b'{"a": 1}'),
    ],
)
def test_insert_with_format_is_split_from_its_data(
    query: str | None, body: bytes, stmt: str, fmt: str, data: bytes
) -> None:
    statement = split_statement(query, body)
    assert (statement.insert_stmt, statement.insert_format, statement.data) == (stmt, fmt, data)


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO t VALUES (1, 'FORMAT x')",
        "INSERT INTO t SELECT * FROM s FORMAT TSV",
        "/* INSERT INTO t FORMAT CSV */ SELECT 1",
        "SELECT 'INSERT INTO t FORMAT CSV'",
    ],
)
def test_statements_that_are_not_insert_with_data_stay_whole(sql: str) -> None:
    statement = split_statement(None, sql.encode())
    assert statement.insert_stmt is None
    assert statement.sql == sql


def test_url_query_and_body_are_joined_by_a_newline() -> None:
    assert split_statement("SELECT", b"1").sql == "SELECT\n1"
    with pytest.raises(ClickHouseError) as caught:
        split_statement(None, b"  \n ")
    assert caught.value.code == 62


@pytest.mark.parametrize(
    ("sql", "keyword"),
    [
        ("select 1", "SELECT"),
        ("  -- c\n /* x */ (SELECT 1)", "("),
        ("/* a */ /* b */ set x = 1", "SET"),
        ("-- only a comment", ""),
        ("/* unterminated", ""),
    ],
)
def test_first_keyword(sql: str, keyword: str) -> None:
    assert first_keyword(sql) == keyword


@pytest.mark.parametrize(
    ("sql", "target"),
    [
        ("USE db", "db"),
        ("  use `my db` ;  ", "my db"),
        ('/* c */ USE "x";', "x"),
        ("USE db;;", "db;"),
        ("USED db", None),
        ("SELECT 1", None),
        ("USE", None),
    ],
)
def test_use_target(sql: str, target: str | None) -> None:
    assert use_target(sql) == target


@pytest.mark.parametrize(
    ("sql", "tail"),
    [
        ("SELECT 1 FORMAT JSON", "JSON"),
        ("SELECT 1 format TSV ;  ", "TSV"),
        ("SELECT 1 FORMAT TSV; x", None),
        ("SELECT 'FORMAT'", None),
        ("SELECT 1 FORMAT", None),
        ("SELECT 1 FORMATTSV", None),
        ("SELECT 1 AS xformat TSV", None),
        ("FORMAT JSON", "JSON"),
        ("SELECT 1\nformat\tNative\n", "Native"),
    ],
)
def test_format_tail(sql: str, tail: str | None) -> None:
    assert format_tail(sql) == tail
    if tail is None:
        assert without_format_tail(sql) == sql
    else:
        assert format_tail(without_format_tail(sql)) is None
        assert without_format_tail(sql).rstrip() in sql


@pytest.mark.parametrize(
    ("sql", "mentions"),
    [
        ("CREATE TEMPORARY TABLE t (a UInt8)", True),
        ("create temporary table t (a UInt8)", True),
        ("temporary", True),
        ("SELECT 1 AS `x`, 'Temporary'", True),
        ("SELECT temporary_data FROM t", False),
        ("SELECT nontemporary FROM t", False),
        ("SELECT 1", False),
    ],
)
def test_mentions_temporary(sql: str, mentions: bool) -> None:
    assert mentions_temporary(sql) is mentions


def test_exists_on_a_glob_like_name_reads_the_catalog() -> None:
    rewritten = exists_by_catalog("EXISTS TABLE `SELECT * FROM t` FORMAT TSV ;")
    assert rewritten is not None
    assert "FROM system.tables WHERE database = currentDatabase()" in rewritten
    assert "name = 'SELECT * FROM t'" in rewritten
    assert rewritten.endswith(" FORMAT TSV ;")
    assert "database = 'db'" in (exists_by_catalog("EXISTS db.`a?`") or "")
    assert exists_by_catalog("EXISTS TABLE plain_name") is None
    assert exists_by_catalog("SELECT 1") is None
