"""What the command line and the demo print with: exit codes, text tables, short error words.

A leaf module, so that :mod:`clickhouse_lb.cli._main` and :mod:`clickhouse_lb.cli._demo` share it
without importing each other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from clickhouse_lb._redact import redact

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "format_table", "short_error", "visible_width"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


_ANSI_STYLE = re.compile(r"\x1b\[[0-9;]*m")


def visible_width(text: str) -> int:
    """Width of ``text`` on a terminal (colour codes take no room)."""
    return len(_ANSI_STYLE.sub("", text))


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, indent: str = "") -> list[str]:
    """Text columns, left-aligned, two spaces apart, no box drawing (cells may carry colour codes)."""
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, visible_width(cell)) for w, cell in zip(widths, row)]

    def line(cells: Sequence[str]) -> str:
        padded = (cell + " " * (w - visible_width(cell)) for cell, w in zip(cells, widths))
        return (indent + "  ".join(padded)).rstrip()

    return [line(header), *(line(row) for row in rows)]


_SHORT_ERRORS = (
    ("Connection refused", "connection refused"),
    ("timed out", "timed out"),
    ("Read timeout", "timed out"),
    ("NameResolutionError", "DNS failure"),
    ("Name or service not known", "DNS failure"),
    ("Authentication failed", "authentication failed"),
    ("Connection reset", "connection reset"),
    ("RemoteDisconnected", "connection closed by the server"),
)


def short_error(reason: str | None, width: int = 60) -> str:
    """A few words for a table cell out of a (long, already redacted) failure description."""
    if not reason:
        return ""
    for needle, words in _SHORT_ERRORS:
        if needle in reason:
            return words
    text = redact(reason)
    return text if len(text) <= width else text[: width - 3] + "..."
