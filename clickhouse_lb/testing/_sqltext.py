"""Pure, linear-time reading of a request's SQL text: its first keyword, an ``INSERT ... FORMAT``
split from its data, the ``FORMAT`` tail, a ``USE`` target, ``EXISTS`` on a glob-like name.

Why linear time matters: Python's ``re`` holds the GIL for a whole match, so one pattern that
backtracks exponentially stops every thread of the replica, its ``/ping`` answers too. The
former ``(?:\\s+|...)*INSERT`` took 5.6 s on a ``CREATE`` statement indented by 24 spaces (as
clickhouse-connect's own test suite writes them) and made healthy replicas look hung. Here, no
repetition holds a sub-pattern that can split the same text two ways: whitespace is taken one
character per turn, a block comment ends at its first ``*/``, and trailing ``;``/whitespace is
read by code instead of by chains of optional ``\\s*``. ``tests/test_sqltext.py`` times each
pattern on inputs that made the former ones explode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clickhouse_lb.testing._engine import ClickHouseError, sql_string
from clickhouse_lb.testing._request import decode_sql

# One block comment, up to its first "*/", spelled so it cannot stretch over the next comment
# (a lazy ".*?" can, which makes a run of comments backtrack exponentially).
_BLOCK_COMMENT = r"/\*(?:[^*]|\*(?!/))*\*/"
_LEADING_NOISE = re.compile(rf"^(?:\s|--[^\n]*(?:\n|$)|{_BLOCK_COMMENT})*", re.S)
_FIRST_WORD = re.compile(r"\(|[A-Za-z_]+")
#: ``FORMAT name`` at the end of a statement (optionally followed by ``;``).
FORMAT_TAIL = re.compile(r"\bFORMAT\s+([A-Za-z0-9_]+)\s*(?:;\s*)?$", re.I)
_INSERT_DATA = re.compile(
    rb"^(?P<stmt>(?:\s|--[^\n]*\n|" + _BLOCK_COMMENT.encode() + rb")*INSERT\s+INTO\s.*?)"
    rb"\bFORMAT\s+(?P<fmt>[A-Za-z0-9_]+)[ \t]*(?:\r?\n|;|$)",
    re.I | re.S,
)
_VALUES_OR_SELECT = re.compile(rb"\b(?:VALUES|SELECT|WITH)\b", re.I)
_IDENT = r"(?:`(?:[^`\\]|\\.)*`|\"(?:[^\"\\]|\\.)*\"|[A-Za-z_][A-Za-z0-9_]*)"
_EXISTS = re.compile(
    rf"^EXISTS\s+(?:TEMPORARY\s+)?(?:TABLE\s+|VIEW\s+|DICTIONARY\s+)?(?:(?P<db>{_IDENT})\s*\.\s*)?(?P<name>{_IDENT})"
    r"(?P<rest>\s*(?:FORMAT\s+[A-Za-z0-9_]+\s*)?(?:;\s*)?)$",
    re.I | re.S,
)


@dataclass
class Statement:
    """A request's SQL, split like ClickHouse does: the statement, and insert data if any."""

    sql: str
    insert_stmt: str | None = None
    insert_format: str | None = None
    data: bytes = b""


def without_leading_noise(sql: str) -> str:
    """``sql`` without its leading whitespace and comments."""
    return _LEADING_NOISE.sub("", sql, count=1)


def first_keyword(sql: str) -> str:
    """The statement's first word, upper-cased (``(`` for a parenthesised one; ``""`` if none)."""
    match = _FIRST_WORD.match(without_leading_noise(sql))
    return match.group(0).upper() if match else ""


def split_statement(url_query: str | None, body: bytes) -> Statement:
    """The query of a request (URL ``query`` and/or body, joined by a newline, as ClickHouse does);
    for ``INSERT INTO ... FORMAT X`` the rest after the format name's line is the data."""
    if url_query and body:
        full = url_query.encode("utf-8", "surrogateescape") + b"\n" + body
    elif url_query:
        full = url_query.encode("utf-8", "surrogateescape")
    else:
        full = body
    if not full.strip():
        raise ClickHouseError.make(62, "Empty query")
    match = _INSERT_DATA.match(full)
    if match and not _VALUES_OR_SELECT.search(match.group("stmt")):
        stmt = decode_sql(match.group("stmt")).strip()
        return Statement(stmt, stmt, match.group("fmt").decode(), full[match.end() :])
    return Statement(decode_sql(full))


def use_target(sql: str) -> str | None:
    """The database a ``USE db`` statement switches to (quotes removed), else ``None``."""
    rest = without_leading_noise(sql)
    if len(rest) < 4 or rest[:3].upper() != "USE" or not rest[3].isspace():
        return None
    target = rest[4:].strip()
    if target.endswith(";"):
        target = target[:-1].rstrip()
    return target.strip('`"') if target else None


def _unquote(ident: str) -> str:
    if ident[:1] in '`"' and ident[-1:] == ident[:1]:
        return re.sub(r"\\(.)", r"\1", ident[1:-1])
    return ident


def exists_by_catalog(sql: str) -> str | None:
    """``EXISTS [TABLE] name`` for a name with glob characters, answered from system.tables.

    chdb answers 1 for names with ``*`` or ``?`` (it treats them as file globs); pandas'
    ``read_sql`` asks ``EXISTS TABLE `SELECT * ...``` to tell a query from a table name.
    """
    match = _EXISTS.match(without_leading_noise(sql))
    if match is None:
        return None
    name = _unquote(match.group("name"))
    if not any(ch in name for ch in "*?{"):
        return None
    db = sql_string(_unquote(match.group("db"))) if match.group("db") else "currentDatabase()"
    return (
        f"SELECT toUInt8(count() > 0) AS result FROM system.tables WHERE database = {db} "
        f"AND name = {sql_string(name)}{match.group('rest')}"
    )
