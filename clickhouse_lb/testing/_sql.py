"""What the local cluster's replication needs to know about a statement (pure functions, no I/O).

A small lexer (strings, quoted identifiers, comments and brackets are skipped correctly) and a
classifier for the statements that replication handles: inserts, CREATE/DROP/ALTER/TRUNCATE/
DELETE/OPTIMIZE/RENAME of tables, ``ON CLUSTER`` clauses, ``Replicated*MergeTree`` engines,
``SYSTEM SYNC REPLICA`` / ``STOP|START FETCHES``, and references to ``system.clusters`` /
``system.replicas``. Everything else is ``None``: the engine runs it unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>--[^\n]*|\#[^\n]*|/\*.*?\*/)
  | (?P<string>'(?:[^'\\]|\\.|'')*')
  | (?P<qident>`(?:[^`\\]|\\.|``)*`|"(?:[^"\\]|\\.|"")*")
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<number>\d[\w.]*)
  | (?P<punct>.)
    """,
    re.S | re.X,
)


@dataclass(frozen=True)
class Token:
    kind: str  # word, qident, string, number, punct
    text: str
    start: int
    end: int
    depth: int  # bracket depth before this token

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    @property
    def ident(self) -> str:
        """The identifier this token names (unquoted), or '' if it is not one."""
        if self.kind == "word":
            return self.text
        if self.kind == "qident":
            quote = self.text[0]
            return self.text[1:-1].replace(quote * 2, quote).replace("\\" + quote, quote).replace("\\\\", "\\")
        return ""


def tokens(sql: str) -> list[Token]:
    """The significant tokens of ``sql`` (no whitespace or comments), with bracket depth."""
    out: list[Token] = []
    depth = 0
    for match in _TOKEN.finditer(sql):
        kind = match.lastgroup or "punct"
        if kind in ("ws", "comment"):
            continue
        text = match.group()
        if kind == "punct" and text in ")]":
            depth = max(0, depth - 1)
        out.append(Token(kind, text, match.start(), match.end(), depth))
        if kind == "punct" and text in "([":
            depth += 1
    return out


def quote_ident(name: str) -> str:
    """A backquoted identifier."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def qualified(database: str, table: str) -> str:
    return f"{quote_ident(database)}.{quote_ident(table)}"


def sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def unquote_string(literal: str) -> str:
    body = literal[1:-1]
    return re.sub(r"\\(.)|''", lambda m: m.group(1) if m.group(1) is not None else "'", body)


@dataclass
class TableName:
    """A (possibly database-qualified) table name and where it is in the statement."""

    database: str | None
    table: str
    start: int
    end: int

    def resolve(self, current_db: str) -> tuple[str, str]:
        return (self.database or current_db, self.table)


@dataclass
class Statement:
    """A classified statement.

    ``kind``: insert, create_table, drop_table, table_write (ALTER/TRUNCATE/DELETE/OPTIMIZE of a
    table), rename, create_database, drop_database, other_ddl, sync_replica, fetches (SYSTEM
    STOP/START FETCHES or REPLICATION QUEUES), select (reads mentioning system tables).
    """

    kind: str
    sql: str
    table: TableName | None = None
    cluster: str | None = None  # the ON CLUSTER name, if any
    local_sql: str = ""  # the statement without its ON CLUSTER clause
    verb: str = ""  # table_write / insert: the words before the table name, normalised
    engine: EngineSpec | None = None  # create_table with a Replicated*MergeTree engine
    explicit_uuid: str | None = None
    renames: list[tuple[TableName, TableName]] = field(default_factory=list)
    stop: bool = False  # fetches: STOP (True) or START (False)
    database: str | None = None  # create/drop database
    system_tables: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, name)


@dataclass
class EngineSpec:
    """A Replicated*MergeTree engine clause and its MergeTree replacement."""

    name: str  # e.g. ReplicatedReplacingMergeTree
    local_name: str  # e.g. ReplacingMergeTree
    zookeeper_path: str | None  # the unexpanded arguments, None when omitted
    replica_name: str | None
    start: int  # span of the engine call in local_sql
    end: int
    local_clause: str  # e.g. ReplacingMergeTree(ver)


_INSERT_HEAD = re.compile(r"^\s*INSERT\b", re.I)
_INSERT_PREFIX = 4096
_REPLICATED_ENGINE = re.compile(r"^Replicated(\w*MergeTree)$")
_CLUSTER_KEYWORDS = ("ON", "CLUSTER")


def _name_at(toks: list[Token], i: int) -> tuple[TableName, int] | None:
    """Parse ``[db.]name`` starting at token ``i``; return it and the index after it."""
    if i >= len(toks) or not toks[i].ident:
        return None
    first = toks[i]
    if i + 2 < len(toks) and toks[i + 1].text == "." and toks[i + 2].ident:
        second = toks[i + 2]
        return TableName(first.ident, second.ident, first.start, second.end), i + 3
    return TableName(None, first.ident, first.start, first.end), i + 1


def _skip_words(toks: list[Token], i: int, *words: str) -> int:
    """Skip the optional word sequence ``words`` at ``i`` (all or nothing)."""
    if i + len(words) <= len(toks) and all(toks[i + k].upper == w for k, w in enumerate(words)):
        return i + len(words)
    return i


def _strip_on_cluster(sql: str, toks: list[Token]) -> tuple[str | None, str, int]:
    """Find a top-level ``ON CLUSTER name``; return (name, sql without it, index of ON or -1)."""
    for i in range(len(toks) - 2):
        if toks[i].depth == 0 and toks[i].upper == "ON" and toks[i + 1].upper == "CLUSTER":
            name_tok = toks[i + 2]
            name = name_tok.ident or (unquote_string(name_tok.text) if name_tok.kind == "string" else name_tok.text)
            return name, sql[: toks[i].start] + sql[name_tok.end :], i
    return None, sql, -1


def _engine(sql: str) -> EngineSpec | None:
    toks = tokens(sql)
    for i, tok in enumerate(toks):
        if tok.depth == 0 and tok.upper == "ENGINE":
            j = i + 1
            if j < len(toks) and toks[j].text == "=":
                j += 1
            if j >= len(toks) or toks[j].kind != "word":
                return None
            match = _REPLICATED_ENGINE.match(toks[j].text)
            if not match:
                return None
            start, end = toks[j].start, toks[j].end
            args: list[tuple[int, int]] = []  # spans of top-level arguments
            if j + 1 < len(toks) and toks[j + 1].text == "(":
                level = toks[j + 1].depth + 1
                k = j + 2
                arg_start = k
                while k < len(toks) and not (toks[k].text == ")" and toks[k].depth == level - 1):
                    if toks[k].text == "," and toks[k].depth == level:
                        args.append((arg_start, k))
                        arg_start = k + 1
                    k += 1
                if k > arg_start:
                    args.append((arg_start, k))
                end = toks[k].end if k < len(toks) else len(sql)
            texts = [sql[toks[a].start : toks[b - 1].end] for a, b in args]
            path = replica = None
            rest = texts
            if len(args) >= 2 and all(toks[a].kind == "string" and b == a + 1 for a, b in args[:2]):
                path, replica = unquote_string(texts[0]), unquote_string(texts[1])
                rest = texts[2:]
            local = match.group(1)
            clause = f"{local}({', '.join(rest)})" if rest or (j + 1 < len(toks) and toks[j + 1].text == "(") else local
            return EngineSpec(toks[j].text, local, path, replica, start, end, clause)
    return None


def _system_tables(toks: list[Token], names: tuple[str, ...] = ("clusters", "replicas")) -> list[tuple[int, int, str]]:
    found: list[tuple[int, int, str]] = []
    for i in range(len(toks) - 2):
        if toks[i].ident.lower() == "system" and toks[i + 1].text == ".":
            name = toks[i + 2].ident.lower()
            if name in names:
                found.append((toks[i].start, toks[i + 2].end, name))
    return found


def system_tables_spans(sql: str) -> list[tuple[int, int, str]]:
    """Where a SELECT names ``system.tables`` (answered by the engine, with the replicated
    tables' engines put back: classify leaves it alone, as the engine's table is mostly right)."""
    return _system_tables(tokens(sql), ("tables",))


def classify(sql: str) -> Statement | None:
    """Classify ``sql`` for replication, or None when replication has nothing to do with it."""
    if _INSERT_HEAD.match(sql) and len(sql) > _INSERT_PREFIX:
        # An INSERT's target is at its start: do not tokenise megabytes of VALUES.
        st = classify(sql[:_INSERT_PREFIX])
        if st is not None and st.kind == "insert" and st.cluster is None:
            st.sql = st.local_sql = sql
        return st
    toks = tokens(sql)
    if not toks:
        return None
    head = toks[0].upper
    if head in ("SHOW", "DESCRIBE", "DESC"):
        return None  # the engine's own system tables have the right schema
    if head in ("SELECT", "WITH", "EXPLAIN") or toks[0].text == "(":
        found = _system_tables(toks)
        return Statement("select", sql, system_tables=found) if found else None
    cluster, local_sql, _on_index = _strip_on_cluster(sql, toks)
    ltoks = tokens(local_sql) if cluster is not None else toks
    st = Statement("other_ddl", sql, cluster=cluster, local_sql=local_sql)
    i = 1
    if head == "INSERT":
        i = _skip_words(ltoks, i, "INTO")
        if i < len(ltoks) and ltoks[i].upper == "FUNCTION":
            return None
        i = _skip_words(ltoks, i, "TABLE")
        parsed = _name_at(ltoks, i)
        if parsed is None:
            return None
        st.kind, st.table, st.verb = "insert", parsed[0], "INSERT INTO"
        return st
    if head in ("CREATE", "ATTACH", "REPLACE"):
        i = _skip_words(ltoks, i, "OR", "REPLACE")
        what = ltoks[i].upper if i < len(ltoks) else ""
        if what == "TABLE":
            i = _skip_words(ltoks, i + 1, "IF", "NOT", "EXISTS")
            parsed = _name_at(ltoks, i)
            if parsed is None:
                return st if cluster else None
            st.kind, st.table = "create_table", parsed[0]
            j = parsed[1]
            if j + 1 < len(ltoks) and ltoks[j].upper == "UUID" and ltoks[j + 1].kind == "string":
                st.explicit_uuid = unquote_string(ltoks[j + 1].text)
            st.engine = _engine(local_sql)
            return st if (st.engine is not None or cluster is not None) else None
        if what == "DATABASE":
            i = _skip_words(ltoks, i + 1, "IF", "NOT", "EXISTS")
            parsed = _name_at(ltoks, i)
            st.kind = "create_database"
            st.database = parsed[0].table if parsed else None
            return st
        return st if cluster else None
    if head in ("DROP", "DETACH"):
        i = _skip_words(ltoks, i, "TEMPORARY")
        what = ltoks[i].upper if i < len(ltoks) else ""
        if what in ("TABLE", "DICTIONARY", "VIEW"):
            i = _skip_words(ltoks, i + 1, "IF", "EXISTS")
            parsed = _name_at(ltoks, i)
            if parsed is not None:
                st.kind, st.table = "drop_table", parsed[0]
            return st
        if what == "DATABASE":
            i = _skip_words(ltoks, i + 1, "IF", "EXISTS")
            parsed = _name_at(ltoks, i)
            st.kind = "drop_database"
            st.database = parsed[0].table if parsed else None
            return st
        return st if cluster else None
    if head in ("ALTER", "TRUNCATE", "OPTIMIZE", "DELETE"):
        verb = {"ALTER": ("TABLE",), "TRUNCATE": ("TABLE",), "OPTIMIZE": ("TABLE",), "DELETE": ("FROM",)}[head]
        if head == "TRUNCATE":
            i = _skip_words(ltoks, i, "TEMPORARY")
            if _skip_words(ltoks, i, "TABLE") == i and i < len(ltoks) and ltoks[i].upper == "DATABASE":
                return st if cluster else None
            i = _skip_words(ltoks, i, "TABLE")
            i = _skip_words(ltoks, i, "IF", "EXISTS")
        elif _skip_words(ltoks, i, *verb) == i:
            return st if cluster else None
        else:
            i = _skip_words(ltoks, i, *verb)
        parsed = _name_at(ltoks, i)
        if parsed is None:
            return st if cluster else None
        st.kind, st.table = "table_write", parsed[0]
        st.verb = local_sql[: parsed[0].start].strip()
        return st
    if head in ("RENAME", "EXCHANGE"):
        if head == "RENAME" and _skip_words(ltoks, 1, "TABLE") == 2:
            j = 2
            while True:
                a = _name_at(ltoks, j)
                if a is None or a[1] >= len(ltoks) or ltoks[a[1]].upper != "TO":
                    break
                b = _name_at(ltoks, a[1] + 1)
                if b is None:
                    break
                st.renames.append((a[0], b[0]))
                j = b[1]
                if j < len(ltoks) and ltoks[j].text == ",":
                    j += 1
                    continue
                break
            st.kind = "rename"
        return st
    if head == "SYSTEM":
        words = [t.upper for t in ltoks[1:4]]
        if words[:2] == ["SYNC", "REPLICA"]:
            parsed = _name_at(ltoks, 3)
            if parsed is not None:
                st.kind, st.table = "sync_replica", parsed[0]
                return st
        if (
            len(words) >= 2
            and words[0] in ("STOP", "START")
            and (words[1] == "FETCHES" or words[1:3] == ["REPLICATION", "QUEUES"])
        ):
            st.kind, st.stop = "fetches", words[0] == "STOP"
            return st
        return None
    return st if cluster else None


_MACRO = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_macros(template: str, macros: dict[str, str]) -> str:
    """Substitute ``{name}`` macros; an unknown one raises KeyError(name)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in macros:
            raise KeyError(name)
        return macros[name]

    return _MACRO.sub(one, template)


def replace_spans(sql: str, spans: list[tuple[int, int, str]]) -> str:
    """Replace each (start, end) span of ``sql`` by its text (spans must not overlap)."""
    out, last = [], 0
    for start, end, text in sorted(spans):
        out.append(sql[last:start])
        out.append(text)
        last = end
    out.append(sql[last:])
    return "".join(out)


def with_insert_settings(sql: str, table_end: int, settings: dict[str, str]) -> str | None:
    """``sql`` (an INSERT whose table name ends at ``table_end``) with a ``SETTINGS`` clause of
    ``settings`` after its column list, or None when it has a SETTINGS clause of its own there
    (or a shape not understood): the caller then sets them on the connection instead.

    ``INSERT INTO t [(c1, c2)] SETTINGS k = v [VALUES | FORMAT f | SELECT ...]``: a query-level
    clause costs nothing, where a ``SET`` before and after the insert costs two queries."""
    head = tokens(sql[table_end : table_end + _INSERT_PREFIX])
    at = 0
    if head and head[0].text == "(":
        closing = next((t for t in head[1:] if t.text == ")" and t.depth == 0), None)
        if closing is None or (len(head) > 1 and head[1].upper in ("SELECT", "WITH")):
            return None  # a long column list, or INSERT INTO t (SELECT ...)
        at = closing.end
        rest = [t for t in head if t.start >= closing.end]
    else:
        rest = head
    if rest and rest[0].upper == "SETTINGS":
        return None
    if rest and rest[0].upper not in ("VALUES", "FORMAT", "SELECT", "WITH") and rest[0].text != "(":
        return None
    clause = ", ".join(f"{name} = {sql_string(value)}" for name, value in settings.items())
    cut = table_end + at
    tail = sql[cut:].lstrip()
    return f"{sql[:cut]} SETTINGS {clause}" + (f" {tail}" if tail else "")


def inline_settings(sql: str) -> dict[str, str]:
    """``SETTINGS a = 1, b = 'x'`` written in an INSERT statement itself."""
    toks = tokens(sql)
    out: dict[str, str] = {}
    for i, tok in enumerate(toks):
        if tok.depth == 0 and tok.upper == "SETTINGS":
            j = i + 1
            while j + 2 < len(toks) and toks[j].ident and toks[j + 1].text == "=":
                value = toks[j + 2]
                out[toks[j].ident] = unquote_string(value.text) if value.kind == "string" else value.text
                j += 3
                if j < len(toks) and toks[j].text == ",":
                    j += 1
                else:
                    break
    return out


def inserts_a_select(rest: str) -> bool:
    """Whether an INSERT's text after the table name takes its rows from a SELECT."""
    for tok in tokens(rest[:4096]):
        if tok.depth == 0 and tok.upper in ("SELECT", "WITH"):
            return True
        if tok.depth == 0 and tok.upper in ("VALUES", "FORMAT"):
            return False
    return False


def literal(value: object) -> str:
    """A ClickHouse literal for a JSON-like Python value (dicts become maps)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "map(" + ", ".join(f"{literal(k)}, {literal(v)}" for k, v in value.items()) + ")"
    return sql_string(str(value))


def literal_table(columns: list[tuple[str, str]], rows: list[dict[str, object]]) -> str:
    """A parenthesised subquery whose result has exactly ``columns`` (name, type) and ``rows``.

    Columns a row lacks get their type's default value."""

    def select(row: dict[str, object]) -> str:
        parts = []
        for name, type_ in columns:
            if name in row and not (row[name] == {} and type_.startswith("Map")):
                value = f"CAST({literal(row[name])} AS {type_})"
            else:
                value = f"defaultValueOfTypeName({sql_string(type_)})"
            parts.append(f"{value} AS {quote_ident(name)}")
        return "SELECT " + ", ".join(parts)

    if not rows:
        return f"({select({})} LIMIT 0)"
    return "(" + " UNION ALL ".join(select(row) for row in rows) + ")"
