"""One statement as the pool sees it before running it (pure, no I/O).

Which statement it carries (to tell reads from writes), which balancing settings it gives
for itself (``settings={"load_balancing": ...}``, taken out before the call reaches the
server), and, for inserts, the ``insert_deduplication_token`` that makes a retry safe.
Shared by the sync and async pools: their Client method signatures agree on these points.
"""

from __future__ import annotations

import copy
import inspect
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from clickhouse_lb._redact import shown
from clickhouse_lb.config._values import as_bool
from clickhouse_lb.config.attempt_settings import (
    NO_STATEMENT_SETTINGS,
    STATEMENT_ATTEMPT_SETTING_NAMES,
    StatementAttemptSettings,
    split_statement_attempt_settings,
)
from clickhouse_lb.config.read_your_writes import READ_YOUR_WRITES
from clickhouse_lb.config.settings import (
    NO_OVERRIDES,
    STATEMENT_SETTING_NAMES,
    StatementOverrides,
    split_statement_settings,
)
from clickhouse_lb.errors import ConfigurationError

__all__ = [
    "INSERT_METHODS", "POOL_SETTING_NAMES", "PreparedCall", "StatementKind", "after_leading_noise", "is_read_only",
    "prepare_call", "settings_positions", "split_pool_settings",
]

#: Methods that write rows: a deduplication token makes them retryable after sending.
INSERT_METHODS = frozenset({"insert", "insert_df", "insert_arrow", "insert_df_arrow", "raw_insert", "data_insert"})
_TOKEN = "insert_deduplication_token"
#: The per-statement setting that declares a write safe to repeat (``CREATE TABLE IF NOT
#: EXISTS``, ``ALTER ... IF EXISTS``, an upsert into a ReplacingMergeTree ...): it fails over
#: even after its request was sent. Taken out before the statement reaches the server.
IDEMPOTENT = "idempotent"
_LEADING_NOISE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|#[^\n]*(?:\n|$)|/\*.*?\*/|\()*", re.DOTALL)
_READ_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN", "VALUES"})
#: ``WITH ... INSERT INTO``: a leading WITH clause does not make an insert a read. Looked for in
#: the whole text (a literal that reads "INSERT INTO" makes a read count as a write: the safe side).
_INSERT_INTO_WORDS = re.compile(r"\bINSERT\s+INTO\b", re.IGNORECASE)


def after_leading_noise(sql: str) -> str:
    """``sql`` without its leading whitespace, comments and opening brackets."""
    start = _LEADING_NOISE.match(sql)
    return sql[start.end() if start else 0 :]


def is_read_only(sql: str | bytes | None) -> bool:
    """Whether a statement only reads (so repeating it elsewhere is harmless)."""
    if sql is None:
        return False
    if isinstance(sql, (bytes, bytearray)):
        sql = bytes(sql[:4096]).decode("utf-8", "replace")
    rest = after_leading_noise(sql)
    word = re.sub(r"[^A-Za-z].*", "", rest[:8].split(None, 1)[0] if rest.strip() else "").upper()
    return word in _READ_KEYWORDS and not (word == "WITH" and _INSERT_INTO_WORDS.search(rest))


def settings_positions(client_class: type, methods: list[str]) -> dict[str, int | None]:
    """Position of the ``settings`` parameter (after self) in each method, if positional."""
    positions: dict[str, int | None] = {}
    for name in methods:
        method = getattr(client_class, name, None)
        if method is None:
            positions[name] = None
            continue
        params = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]
        positions[name] = next(
            (i for i, p in enumerate(params) if p.name == "settings" and p.kind is p.POSITIONAL_OR_KEYWORD), None
        )
    return positions


class StatementKind(Protocol):
    """What failover and the attempts' waits ask of a statement, only once it matters (a
    failure, a hedge, a deadline): a :class:`PreparedCall` decides it on first use."""

    @property
    def write(self) -> bool: ...

    @property
    def retry_after_send(self) -> bool: ...


class PreparedCall:
    """One statement as the pool runs it: its arguments (balancing settings taken out) and
    what its failure would mean. Whether it writes (``write``, and so ``retry_after_send``) is
    decided on first use: on the common path, where its first attempt succeeds, nothing asks."""

    # No ``__slots__``: what a statement without settings leaves as it is stays a class
    # attribute (the common statement stores four values, see :func:`prepare_call`).
    overrides: StatementOverrides = NO_OVERRIDES
    settings: Mapping[str, Any] | None = None
    attempt_settings: StatementAttemptSettings = NO_STATEMENT_SETTINGS
    query_id: str | None = None
    read_your_writes: bool | None = None
    _write: bool | None = None
    _text: Any = None
    _safe = False

    # Made only by :func:`prepare_call`, by hand (no ``__init__``: one per statement).
    #: The call's arguments as they go to the client.
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: Where ``settings`` stands among the method's positional parameters (None: keyword only).
    settings_position: int | None
    # ``overrides``: its balancing settings; ``settings``: its settings as they go to the server
    # (balancing ones taken out); ``attempt_settings``: its own timeouts / hedging;
    # ``query_id``: the one it gave in its settings; ``read_your_writes``: its own setting (None:
    # not given, the pool's or a block's applies). ``_write`` None: decided from ``_text`` (the
    # statement's SQL) when first asked. ``_safe``: repeatable after its request was sent
    # whatever it is (a deduplication token, ``idempotent``).

    @property
    def write(self) -> bool:
        """Whether the statement may change data (not a read): its failure says whether it may
        have been applied. A statement that is not a write only reads (it may be hedged)."""
        write = self._write
        if write is None:
            write = self._write = not is_read_only(self._text)
        return write

    @property
    def text(self) -> Any:
        """The statement's SQL (or query context) when it is not an insert method; else None."""
        return self._text

    @property
    def read_only(self) -> bool:
        """The statement only reads (the opposite of :attr:`write`): it may be hedged."""
        return not self.write

    @property
    def retry_after_send(self) -> bool:
        """Whether a failed attempt may be repeated after its request was sent: a read, or a
        write made repeatable (a deduplication token, ``idempotent``)."""
        return self._safe or not self.write

    def with_query_id(self, query_id: str | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's arguments with ``query_id`` among its settings (None: unchanged)."""
        if query_id is None or query_id == self.query_id:
            return self.args, self.kwargs
        position = self.settings_position
        args, kwargs = self.args, self.kwargs
        if position is not None and len(args) > position and "settings" not in kwargs:
            settings = {**(args[position] or {}), "query_id": query_id}
            return (*args[:position], settings, *args[position + 1 :]), kwargs
        return args, {**kwargs, "settings": {**(kwargs.get("settings") or {}), "query_id": query_id}}


def _statement_text(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    if args and isinstance(args[0], (str, bytes)):
        return args[0]
    for key in ("query", "cmd"):
        if key in kwargs:
            return kwargs[key]
    context = kwargs.get("context")
    return getattr(context, "query", None)


def _write_now(text: Any) -> bool | None:
    """Whether a statement of this text writes, when that must be decided at once (text that
    is not SQL fails here, as it always did); None: plain SQL, decided when first asked."""
    if text is None or isinstance(text, (str, bytes)):
        return None
    return not is_read_only(text)


# The bits uuid.UUID(version=4) sets: the variant (RFC 4122) and the version.
_UUID4_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
_UUID4_SET = (0x8000 << 48) | (4 << 76)


def new_insert_token() -> str:
    """A fresh automatic ``insert_deduplication_token``: ``uuid.uuid4().hex`` (the same 16
    random bytes and version marks), without building a ``UUID`` object for every insert."""
    return f"{int.from_bytes(os.urandom(16), 'big') & _UUID4_CLEAR | _UUID4_SET:032x}"


_new_call = object.__new__

#: The settings the pool takes for itself out of a statement's ``settings=`` (never sent to the server).
POOL_SETTING_NAMES = STATEMENT_SETTING_NAMES | STATEMENT_ATTEMPT_SETTING_NAMES | {IDEMPOTENT, READ_YOUR_WRITES}


def split_pool_settings(settings: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``settings`` split into the pool's own (:data:`POOL_SETTING_NAMES`) and the server's."""
    if not settings or not any(name in POOL_SETTING_NAMES for name in settings):
        return {}, dict(settings or {})
    own = {k: v for k, v in settings.items() if k in POOL_SETTING_NAMES}
    return own, {k: v for k, v in settings.items() if k not in POOL_SETTING_NAMES}


def _context_pool_settings(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any], at: int | None, settings: Mapping[str, Any] | None,
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The call with the pool's own settings of its query or insert context moved into its
    ``settings=`` (the statement's own win), where the pool takes them as it does there: the
    context is copied without them (the caller's is left as it is). None: it has none."""
    positional = method == "data_insert" and not kwargs.get("context") and bool(args)
    context = args[0] if positional else kwargs.get("context")
    given = getattr(context, "settings", None)
    own, rest = split_pool_settings(given if isinstance(given, Mapping) else None)
    if not own:
        return None
    copied: Any = copy.copy(context)
    copied.settings = rest
    merged = {**own, **(settings or {})}
    if positional:
        args = (copied, *args[1:])
    else:
        kwargs = {**kwargs, "context": copied}
    if at is not None:
        return (*args[:at], merged, *args[at + 1 :]), kwargs
    return args, {**kwargs, "settings": merged}


def prepare_call(
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    settings_position: int | None,
    *,
    auto_token: bool,
    new_token: Callable[[], str] = new_insert_token,
) -> PreparedCall:
    insert = method in INSERT_METHODS
    if not insert:
        if (
            not kwargs and args and type(args[0]) is str
            and (settings_position is None or len(args) <= settings_position)
        ):  # the most common statement: plain SQL, no keyword, no settings (a shortcut of the case below)
            call = _new_call(PreparedCall)  # (four stores: the rest are the class's defaults)
            call.args, call.kwargs, call._text, call.settings_position = args, kwargs, args[0], settings_position
            return call
    elif auto_token and kwargs.get("settings") is None and (
        "settings" in kwargs or settings_position is None or len(args) <= settings_position
    ):
        # The common insert: no settings (none positional), no insert context; only the automatic
        # token to add (what the general case below does then, without its steps for settings it
        # has not got).
        context = kwargs.get("context") or (args[0] if method == "data_insert" and args else None)
        if context is None or isinstance(context, (str, bytes)):
            token: dict[str, Any] = {_TOKEN: new_token()}
            call = _new_call(PreparedCall)
            call.args, call.kwargs, call.settings, call.settings_position = (
                args, {**kwargs, "settings": token}, token, settings_position)
            call._write = call._safe = True
            return call
    in_kwargs = "settings" in kwargs
    # Where ``settings`` was given positionally (None: by keyword, or not at all).
    at = settings_position
    if at is None or len(args) <= at or in_kwargs:
        at = None
    settings = kwargs["settings"] if in_kwargs else args[at] if at is not None else None
    if settings is None and not insert:
        # The common case: a statement without settings; nothing to take out or add.
        if args and type(args[0]) is str:  # plain SQL: read or write, decided when it matters
            call = _new_call(PreparedCall)  # (four stores: the rest are the class's defaults)
            call.args, call.kwargs, call._text, call.settings_position = args, kwargs, args[0], settings_position
            return call
        moved = _context_pool_settings(method, args, kwargs, at, settings)
        if moved is not None:  # a query context carrying the pool's own settings: taken as settings=
            args, kwargs = moved
            return prepare_call(method, args, kwargs, settings_position, auto_token=auto_token, new_token=new_token)
        text = _statement_text(args, kwargs)
        call = _new_call(PreparedCall)
        call.args, call.kwargs, call._text, call.settings_position = args, kwargs, text, settings_position
        call._write = _write_now(text)
        return call
    if settings is not None and type(settings) is not dict and not isinstance(settings, Mapping):  # dict: no ABC check
        raise ConfigurationError(
            f"Bad settings {shown(settings)} for {method}(): expected a mapping of server setting names to "
            "values, such as settings={'max_threads': 4}"
        )
    if insert or "context" in kwargs:  # (the pool's own settings in a context: taken as settings= too)
        moved = _context_pool_settings(method, args, kwargs, at, settings)
        if moved is not None:
            args, kwargs = moved
            settings = kwargs["settings"] if at is None else args[at]
    overrides, rest = split_statement_settings(settings) if settings else (NO_OVERRIDES, settings)
    attempt_settings, rest = split_statement_attempt_settings(rest) if rest else (NO_STATEMENT_SETTINGS, rest)
    idempotent = False
    if rest and IDEMPOTENT in rest:
        idempotent = as_bool(IDEMPOTENT, rest[IDEMPOTENT])
        rest = {k: v for k, v in rest.items() if k != IDEMPOTENT}
    read_your_writes: bool | None = None
    if rest and READ_YOUR_WRITES in rest:
        read_your_writes = as_bool(READ_YOUR_WRITES, rest[READ_YOUR_WRITES])
        rest = {k: v for k, v in rest.items() if k != READ_YOUR_WRITES}
    write: bool | None = None
    text = None
    if insert:
        context = kwargs.get("context") or (args[0] if method == "data_insert" and args else None)
        if context is not None and not isinstance(context, (str, bytes)):
            context_settings = getattr(context, "settings", None) or {}
            safe = _TOKEN in context_settings
        else:
            if auto_token and not (rest and _TOKEN in rest):
                rest = {**(rest or {}), _TOKEN: new_token()}
            safe = bool(rest and _TOKEN in rest)
        write = True
    else:
        text = _statement_text(args, kwargs)  # read or write: decided when it matters
        write = _write_now(text)
        safe = bool(rest and _TOKEN in rest)
    if rest is not settings:
        if at is not None:
            args = (*args[:at], rest, *args[at + 1 :])
        else:
            kwargs = {**kwargs, "settings": rest}
    query_id = rest.get("query_id") if rest else None
    call = _new_call(PreparedCall)
    call.args, call.kwargs, call._text, call.settings_position = args, kwargs, text, settings_position
    call.overrides, call.settings, call.attempt_settings = overrides, rest, attempt_settings
    call.query_id, call.read_your_writes = (str(query_id) if query_id is not None else None), read_your_writes
    call._write, call._safe = write, safe or idempotent
    return call
