"""Reading a request's SQL in time that does not blow up with its text: its first keyword, an
``INSERT ... FORMAT`` split from its data, the ``FORMAT`` tail, a ``USE`` target, whether it
mentions ``TEMPORARY``, ``EXISTS`` on a glob-like name. Pure functions, no I/O.

Why it matters: Python's ``re`` holds the GIL for a whole match, so one pattern that backtracks
exponentially, or merely crawls through a big statement, stops every thread of the replica, its
``/ping`` answers too. The former ``(?:\\s+|...)*INSERT`` took 5.6 s on a ``CREATE`` indented
by 24 spaces (as clickhouse-connect's own test suite writes them) and made healthy replicas look
hung; over an 11 MB ``INSERT ... VALUES`` the former ``INSERT ... FORMAT``, ``FORMAT``-tail and
``TEMPORARY`` searches took 0.4, 0.8 and 0.9 s (at a load of 30 on 2 cores), now 16 ms, 0 and
28 ms. Here, no repetition holds a sub-pattern that can split the same text two ways (whitespace
is taken one character per turn, a block comment ends at its first ``*/``), and no regex scans a
statement's whole text: a tail is read from the end, ``TEMPORARY`` is found with ``str.find``,
and ``INSERT ... FORMAT`` is looked for in the first :data:`INSERT_HEAD_LIMIT` bytes only.
``tests/test_sqltext.py`` times each on inputs that made the former patterns explode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clickhouse_lb.testing._engine import ClickHouseError, sql_string
from clickhouse_lb.testing._request import decode_sql

# One block comment, up to its first "*/", spelled so it cannot stretch over the next comment
# (a lazy ".*?" can, which makes a run of comments backtrack exponentially).
_BLOCK_COMMENT = r"/\*(?:[^*]|\*(?!/))*\*/"
_LEADING_NOISE = re.compile(rf"(?:\s|--[^\n]*(?:\n|$)|{_BLOCK_COMMENT})*", re.S)
_FIRST_WORD = re.compile(r"\(|[A-Za-z_]+")
#: How far into a request ``INSERT INTO ... FORMAT name`` is looked for: ClickHouse's default
#: ``max_query_size`` (the statement before its data must fit in it; the data does not count).
INSERT_HEAD_LIMIT = 262144
# The statement must reach FORMAT without passing VALUES/SELECT/WITH (then the data is SQL, not
# a format's): checking that on the way stops the scan of an INSERT ... VALUES at VALUES.
_INSERT_DATA = re.compile(
    rb"^(?P<stmt>(?:\s|--[^\n]*\n|" + _BLOCK_COMMENT.encode() + rb")*INSERT\s+INTO\s"
    rb"(?:(?!\b(?:VALUES|SELECT|WITH)\b).)*?)"
    rb"\bFORMAT\s+(?P<fmt>[A-Za-z0-9_]+)[ \t]*(?:\r?\n|;|$)",
    re.I | re.S,
)
_VALUES_OR_SELECT = re.compile(rb"\b(?:VALUES|SELECT|WITH)\b", re.I)
_IDENT = r"(?:`(?:[^`\\]|\\.)*`|\"(?:[^\"\\]|\\.)*\"|[A-Za-z_][A-Za-z0-9_]*)"
_EXISTS = re.compile(
    rf"EXISTS\s+(?:TEMPORARY\s+)?(?:TABLE\s+|VIEW\s+|DICTIONARY\s+)?(?:(?P<db>{_IDENT})\s*\.\s*)?(?P<name>{_IDENT})"
    r"(?P<rest>\s*(?:FORMAT\s+[A-Za-z0-9_]+\s*)?(?:;\s*)?)$",
    re.I | re.S,
)
_FORMAT_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass
class Statement:
    """A request's SQL, split like ClickHouse does: the statement, and insert data if any."""

    sql: str
    insert_stmt: str | None = None
    insert_format: str | None = None
    data: bytes = b""


def _noise_end(sql: str) -> int:
    """Where the statement starts: after leading whitespace and comments."""
    match = _LEADING_NOISE.match(sql)
    return match.end() if match else 0


def first_keyword(sql: str) -> str:
    """The statement's first word, upper-cased (``(`` for a parenthesised one; ``""`` if none)."""
    match = _FIRST_WORD.match(sql, _noise_end(sql))
    return match.group(0).upper() if match else ""


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _format_tail_start(sql: str) -> tuple[int, str] | None:
    """Where a trailing ``FORMAT name [;]`` starts, and the name; read backwards from the end, so
    the cost is the tail's length, not the statement's."""
    i = len(sql)
    while i and sql[i - 1].isspace():
        i -= 1
    if i and sql[i - 1] == ";":
        i -= 1
        while i and sql[i - 1].isspace():
            i -= 1
    name_end = i
    while i and sql[i - 1] in _FORMAT_NAME_CHARS:
        i -= 1
    if i == name_end:
        return None
    name_start = i
    while i and sql[i - 1].isspace():
        i -= 1
    if i == name_start or i < 6 or sql[i - 6 : i].lower() != "format":
        return None
    if i > 6 and _is_word_char(sql[i - 7]):
        return None
    return i - 6, sql[name_start:name_end]


def format_tail(sql: str) -> str | None:
    """The format a statement ends with (``... FORMAT JSON``, optionally ``;``), else ``None``."""
    found = _format_tail_start(sql)
    return found[1] if found else None


def without_format_tail(sql: str) -> str:
    """``sql`` without its trailing ``FORMAT name [;]`` (unchanged when it has none)."""
    found = _format_tail_start(sql)
    return sql[: found[0]] if found else sql


def mentions_temporary(sql: str) -> bool:
    """Whether the word ``TEMPORARY`` occurs in ``sql`` (any case)."""
    low = sql.lower()
    at = low.find("temporary")
    while at >= 0:
        end = at + 9
        if (at == 0 or not _is_word_char(low[at - 1])) and (end == len(low) or not _is_word_char(low[end])):
            return True
        at = low.find("temporary", end)
    return False


def split_statement(url_query: str | None, body: bytes) -> Statement:
    """The query of a request (URL ``query`` and/or body, joined by a newline, as ClickHouse does);
    for ``INSERT INTO ... FORMAT X`` the rest after the format name's line is the data."""
    if url_query and body:
        full = url_query.encode("utf-8", "surrogateescape") + b"\n" + body
    elif url_query:
        full = url_query.encode("utf-8", "surrogateescape")
    else:
        full = body
    if not full or full.isspace():
        raise ClickHouseError.make(62, "Empty query")
    match = _INSERT_DATA.match(full, 0, INSERT_HEAD_LIMIT)
    if match is not None and match.end() == INSERT_HEAD_LIMIT < len(full):
        match = None  # the statement goes on past max_query_size: not ours to split
    if match and not _VALUES_OR_SELECT.search(match.group("stmt")):
        stmt = decode_sql(match.group("stmt")).strip()
        return Statement(stmt, stmt, match.group("fmt").decode(), full[match.end() :])
    return Statement(decode_sql(full))


def use_target(sql: str) -> str | None:
    """The database a ``USE db`` statement switches to (quotes removed), else ``None``."""
    rest = sql[_noise_end(sql) :]
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
    match = _EXISTS.match(sql, _noise_end(sql))
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
