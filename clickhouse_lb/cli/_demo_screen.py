"""How ``clickhouse-lb demo`` prints: plain lines, or a live area redrawn in place on a terminal."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TextIO


class Screen:
    """Lines on ``out``; on a terminal also a live area redrawn in place (ANSI cursor moves)."""

    _GREEN, _RED, _BOLD, _RESET = "\x1b[32m", "\x1b[31m", "\x1b[1m", "\x1b[0m"

    def __init__(self, out: TextIO, *, live: bool) -> None:
        self.out = out
        self.live = live
        self._drawn: list[str] = []

    @classmethod
    def for_stream(cls, out: TextIO, *, force_plain: bool = False, environ: Mapping[str, str] = os.environ) -> Screen:
        """Live when ``out`` is a terminal, ``NO_COLOR`` is unset and ``TERM`` is not dumb."""
        isatty = getattr(out, "isatty", None)
        tty = bool(isatty and isatty())
        live = tty and not force_plain and not environ.get("NO_COLOR") and environ.get("TERM") != "dumb"
        return cls(out, live=live)

    def paint(self, text: str, style: str) -> str:
        """Colour (``good``, ``bad``, ``bold``) on a live screen; the text unchanged otherwise."""
        if not self.live:
            return text
        code = {"good": self._GREEN, "bad": self._RED, "bold": self._BOLD}[style]
        return f"{code}{text}{self._RESET}"

    def line(self, text: str = "") -> None:
        """A permanent line (above the live area, which is redrawn below it)."""
        drawn = self._drawn
        self._erase()
        self.out.write(text + "\n")
        self._draw(drawn)

    def show(self, lines: Sequence[str]) -> None:
        """Replace the live area (a no-op on a plain screen)."""
        if self.live:
            self._erase()
            self._draw(list(lines))

    def clear(self) -> None:
        """Remove the live area."""
        self._erase()
        self.out.flush()

    def _erase(self) -> None:
        if self._drawn:
            self.out.write(f"\x1b[{len(self._drawn)}F\x1b[J")
            self._drawn = []

    def _draw(self, lines: list[str]) -> None:
        if lines:
            self.out.write("".join(line + "\n" for line in lines))
        self._drawn = lines
        self.out.flush()
