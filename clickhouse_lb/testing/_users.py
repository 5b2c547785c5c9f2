"""Users of the local replica (no engine import: :class:`~clickhouse_lb.testing.LocalCluster` uses these)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class User:
    """A user of the local replica: its password and its ``readonly`` level (0, 1 or 2)."""

    password: str = ""
    readonly: int = 0

    def __post_init__(self) -> None:
        if self.readonly not in (0, 1, 2):
            raise ValueError(f"readonly must be 0, 1 or 2, not {self.readonly!r}")


def users_to_json(users: dict[str, User]) -> str:
    """Serialise users for a replica process (see :func:`users_from_json`)."""
    return json.dumps({name: {"password": u.password, "readonly": u.readonly} for name, u in users.items()})


def users_from_json(text: str) -> dict[str, User]:
    """The inverse of :func:`users_to_json`."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("users: expected a JSON object of name -> {password, readonly}")
    return {str(name): User(str(spec.get("password", "")), int(spec.get("readonly", 0))) for name, spec in data.items()}
