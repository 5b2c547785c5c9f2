"""Pure helpers of the replica's request path: engine-safe text, external data, late errors.

Nothing here does I/O; :mod:`clickhouse_lb.testing.server` calls these while it reads a request
and writes the answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clickhouse_lb.testing._engine import ClickHouseError

# -- text for the engine -----------------------------------------------------------------------

_SURROGATE = re.compile("[\udc80-\udcff]")


def escape_undecodable(text: str) -> str:
    """Turn bytes that were not UTF-8 (kept as surrogates by ``surrogateescape``) into ``\\xHH``.

    The engine takes text, not bytes; ClickHouse reads ``\\xHH`` as that byte both in string
    literals and in query parameter values (escaped format), so binary data survives exactly.
    """
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(lambda m: f"\\x{ord(m.group()) - 0xDC00:02X}", text)


_HEREDOC = re.compile(rb"\$([A-Za-z0-9_]*)\$(.*?)\$\1\$", re.S)


def _quoted_literal(raw: bytes) -> bytes:
    """``raw`` as a quoted ClickHouse string literal; bytes that are not UTF-8 become ``\\xHH``."""
    text = raw.decode("utf-8", "surrogateescape").replace("\\", "\\\\").replace("'", "\\'").replace("\0", "\\0")
    return ("'" + escape_undecodable(text) + "'").encode()


def decode_sql(data: bytes) -> str:
    """Query text for the engine, binary-safe.

    Bytes that are not UTF-8 (binary data in a string literal, or spliced between ``$name$``
    heredoc delimiters as clickhouse-connect does for binary parameters) are written as
    ``\\xHH`` escapes; a heredoc holding such bytes becomes an ordinary quoted literal, since
    a heredoc takes no escapes. The engine reads the very same bytes.
    """
    try:
        return data.decode()
    except UnicodeDecodeError:
        pass

    def heredoc(match: re.Match[bytes]) -> bytes:
        body = match.group(2)
        try:
            body.decode()
        except UnicodeDecodeError:
            return _quoted_literal(body)
        return match.group(0)

    return escape_undecodable(_HEREDOC.sub(heredoc, data).decode("utf-8", "surrogateescape"))


# -- external data (multipart files) -----------------------------------------------------------


@dataclass
class ExternalTable:
    """One external data table of a request: a temporary table that lives for that query."""

    name: str
    structure: str
    fmt: str
    data: bytes


def split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses and quotes (``Decimal(10, 2), Tuple(a String)``)."""
    parts: list[str] = []
    depth = 0
    quote = ""
    start = 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = ""
        elif ch in "'`\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def external_table(name: str, data: bytes, params: dict[str, str]) -> ExternalTable:
    """Build an external table from its file and its ``<name>_format`` / ``_structure`` / ``_types``
    parameters (popped from ``params``), as ClickHouse's HTTP interface defines them."""
    fmt = params.pop(f"{name}_format", "") or "TabSeparated"
    structure = params.pop(f"{name}_structure", "")
    types = params.pop(f"{name}_types", "")
    if not structure:
        if not types:
            raise ClickHouseError.make(
                36, f"Neither structure nor types have not been provided for external table {name}"
            )
        structure = ", ".join(f"_{i} {t}" for i, t in enumerate(split_top_level(types), 1))
    return ExternalTable(name, structure, fmt, data)


# -- an exception after the response started -----------------------------------------------------


def late_exception(tag: str, text: str) -> bytes:
    """The block ClickHouse (25.11+) writes into a response body when a query fails after rows
    were sent: ``__exception__``, the response's ``X-ClickHouse-Exception-Tag``, the message,
    its length and the tag again, so a client can tell it from data."""
    message = text.rstrip("\n").encode()
    block = b"__exception__\r\n" + tag.encode() + b"\r\n" + message + b"\n"
    return block + str(len(message)).encode() + b" " + tag.encode() + b"\r\n__exception__\r\n"
