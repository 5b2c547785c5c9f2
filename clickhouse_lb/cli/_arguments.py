"""What the sub-commands' argument parsers share: a command as one record (its help, its
arguments, what runs it), the ``-v`` option, and the value types argparse checks."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["Command", "int_between", "positive_seconds", "verbose_option"]


@dataclass(frozen=True)
class Command:
    """One ``clickhouse-lb`` sub-command: ``help`` (its line in ``clickhouse-lb --help``) and
    ``description`` (its own ``--help``), ``arguments`` adds its options, ``run`` carries it out
    and returns the exit status."""

    name: str
    help: str
    description: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, TextIO], int]

    def add_to(self, commands: Any) -> None:
        """Register on the sub-command parser (``add_subparsers()``'s)."""
        self.arguments(commands.add_parser(self.name, help=self.help, description=self.description))


def verbose_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=0, help=help)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, not {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, not {text!r}")
    return value


def int_between(low: int, high: int, out_of_range: str) -> Callable[[str], int]:
    """An argparse type: an integer ``low..high``; ``out_of_range`` is the message for one
    outside (``{value}`` stands for it)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, not {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(out_of_range.format(value=value))
        return value

    return parse
