"""A pool's whole configuration: from what the user wrote (keywords, a DSN) to one validated
:class:`PoolConfig` (replicas + balancing settings + every replica's client options).

:mod:`clickhouse_lb.config.settings` holds the balancing settings alone; :mod:`clickhouse_lb.config.replicas`
the replica list; this module puts them together with the clickhouse-connect options.

Shared by :func:`clickhouse_lb.get_pool`, :func:`clickhouse_lb.get_async_pool` and the
SQLAlchemy dialect, so that all three accept the same names and fail the same way.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from clickhouse_lb._redact import mask_options, shown
from clickhouse_lb.config._values import LIMITS, as_bool, bounded
from clickhouse_lb.config.attempt_settings import CLIENT_TIMEOUT_OPTIONS, AttemptSettings, derive_attempt_settings
from clickhouse_lb.config.discovery import (
    DISCOVERY_SETTING_NAMES,
    NO_DISCOVERY,
    DiscoverySettings,
    parse_discovery_settings,
)
from clickhouse_lb.config.health import DEFAULT_HEALTH, HEALTH_SETTING_NAMES, HealthSettings, parse_health_settings
from clickhouse_lb.config.lag import DEFAULT_LAG, LAG_SETTING_NAMES, LagSettings, parse_lag_settings
from clickhouse_lb.config.read_your_writes import (
    DEFAULT_READ_YOUR_WRITES,
    READ_YOUR_WRITES_SETTING_NAMES,
    ReadYourWritesSettings,
    parse_read_your_writes_settings,
)
from clickhouse_lb.config.replicas import DEFAULT_HTTP_PORT, DEFAULT_HTTPS_PORT, Replica, parse_dsn, parse_replicas
from clickhouse_lb.config.retry_budget import (
    DEFAULT_RETRY_BUDGET,
    RETRY_BUDGET_SETTING_NAMES,
    RetryBudgetSettings,
    parse_retry_budget_settings,
)
from clickhouse_lb.config.settings import (
    BALANCING_SETTING_NAMES,
    BalancingSettings,
    parse_balancing_settings,
    unknown_name_error,
)
from clickhouse_lb.config.timeouts import parse_seconds, pool_timeouts
from clickhouse_lb.config.tls import uses_tls
from clickhouse_lb.errors import ConfigurationError

__all__ = [
    "PoolConfig",
    "async_client_option_names",
    "resolve_pool_config",
    "sync_client_option_names",
]

#: The option (keyword, DSN and URL parameter) that turns state sharing off for one pool or engine
#: (see :mod:`clickhouse_lb.core.shared_state`).
SHARE_STATE = "share_state"

#: Options the pool decides per replica; a user may not pass them through.
_POOL_OWNED = {
    "host": "pass hosts=[...] (or a dsn) to the pool instead",
    "port": "give each host as 'host:port'",
    "dsn": "pass dsn= to the pool",
}


#: Other spellings ``create_client`` reads from its keyword arguments (or a DSN's query).
_USERNAME_ALIASES = ("user", "user_name")


def create_client_spellings(options: Mapping[str, Any], valid_client_options: frozenset[str]) -> dict[str, Any]:
    """The options as ``clickhouse_connect.get_client`` reads them: ``user=``/``user_name=`` for
    ``username``, ``compression=`` for ``compress``, and ``generic_args`` spread out as it
    does (a client option by name, ``headers``, else a server setting, ``ch_`` prefix dropped;
    its values win over the keywords, as there). ``interface="chdb"`` (an in-process engine, not
    a server) is refused."""
    options = dict(options)
    generic = options.pop("generic_args", None)
    if generic:
        if not isinstance(generic, Mapping):
            raise ConfigurationError(f"Bad generic_args {type(generic).__name__}: expected a dict of options")
        settings = dict(options.get("settings") or {})
        for name, value in generic.items():
            if name == "headers" and "headers" in valid_client_options:  # clickhouse-connect >= 1.0
                options.setdefault("headers", value)
            elif name in valid_client_options or name in _POOL_OWNED or name in _USERNAME_ALIASES:
                options[name] = value
            elif name == "compression":
                options.setdefault("compress", value)
            else:
                settings[name[3:] if name.startswith("ch_") else name] = value
        if settings:
            options["settings"] = settings
    for alias in _USERNAME_ALIASES:
        if alias in options:
            value = options.pop(alias)
            if options.get("username") is None:
                options["username"] = value
    if "compression" in options:
        value = options.pop("compression")
        options.setdefault("compress", value)
    interface = options.get("interface")
    if isinstance(interface, str) and interface.strip().lower() == "chdb":
        raise ConfigurationError(
            "interface='chdb' is clickhouse-connect's in-process engine, not a server: a pool balances "
            "over ClickHouse servers (interface='http' or 'https')"
        )
    return options


def _parameter_names(*callables: Any) -> frozenset[str]:
    names: set[str] = set()
    for fn in callables:
        for parameter in inspect.signature(fn).parameters.values():
            if parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL) and parameter.name != "self":
                names.add(parameter.name)
    return frozenset(names)


_SYNC_NAMES: frozenset[str] | None = None


def sync_client_option_names() -> frozenset[str]:
    """Every option ``clickhouse_connect.get_client`` understands (its own and HttpClient's)."""
    global _SYNC_NAMES
    if _SYNC_NAMES is None:
        from clickhouse_connect.driver import create_client
        from clickhouse_connect.driver.httpclient import HttpClient

        _SYNC_NAMES = _parameter_names(create_client, HttpClient.__init__) - set(_POOL_OWNED)
    return _SYNC_NAMES


_ASYNC_NAMES: frozenset[str] | None = None


def async_client_option_names() -> frozenset[str]:
    """Every option ``clickhouse_connect.get_async_client`` understands (its own and
    AsyncClient's), less those the pool decides per replica. Imports aiohttp."""
    global _ASYNC_NAMES
    if _ASYNC_NAMES is None:
        from clickhouse_connect.driver import create_async_client
        from clickhouse_connect.driver.asyncclient import AsyncClient

        _ASYNC_NAMES = _parameter_names(create_async_client, AsyncClient.__init__) - set(_POOL_OWNED)
    return _ASYNC_NAMES


@dataclass(frozen=True)
class PoolConfig:
    """Everything a pool needs: replicas, balancing settings, options for every replica's
    client, and how the background health probes run. Each setting is stored once, as
    resolved from what the user gave; what follows from them (:attr:`attempts`,
    :attr:`secure`) is computed, so ``dataclasses.replace`` (discovery, shared state) keeps
    every option."""

    replicas: list[Replica]
    settings: BalancingSettings
    #: What each replica's client is given, less the timeouts (the pool gives each client
    #: its own, exact values: :attr:`attempts`).
    client_options: dict[str, Any]
    health: HealthSettings = DEFAULT_HEALTH
    lag: LagSettings = DEFAULT_LAG
    #: Share the balancing state with the process's other pools over the same replica set
    #: (clickhouse_lb.core.shared_state); False: a state of this pool's own.
    share_state: bool = True
    #: Replicas read from ``system.clusters`` (``cluster=``); ``replicas`` are then the seeds
    #: until the pool has discovered the set (:mod:`clickhouse_lb.core.discovery`).
    discovery: DiscoverySettings = NO_DISCOVERY
    #: The hosts the user gave, when ``replicas`` were discovered from them.
    seeds: tuple[Replica, ...] = ()
    #: The timeout options the user gave (:data:`CLIENT_TIMEOUT_OPTIONS`), in seconds.
    timeout_options: Mapping[str, float] = field(default_factory=dict)
    #: The limit on the requests the pool sends on its own (clickhouse_lb.core.retry_budget).
    retry_budget: RetryBudgetSettings = DEFAULT_RETRY_BUDGET
    #: Reads that follow a write go to a replica known to have it (clickhouse_lb.core.read_your_writes).
    read_your_writes: ReadYourWritesSettings = DEFAULT_READ_YOUR_WRITES

    def __post_init__(self) -> None:
        mixed = sorted(name for name in CLIENT_TIMEOUT_OPTIONS if name in self.client_options)
        if mixed:
            raise ValueError(f"timeout options {mixed} belong in timeout_options (seconds), not client_options")

    @cached_property
    def attempts(self) -> AttemptSettings:
        """How attempts wait (timeouts, liveness, hedging): from the settings and the timeout
        options; the connect timeout depends on the number of replicas, as on the server."""
        timeouts, _ = pool_timeouts(
            self.timeout_options,
            connect_timeout_with_failover_ms=self.settings.connect_timeout_with_failover_ms,
            replicas=len(self.replicas),
        )
        return derive_attempt_settings(self.settings, timeouts)

    @property
    def secure(self) -> bool:
        """The replicas speak HTTPS (:func:`clickhouse_lb.config.tls.uses_tls`)."""
        return uses_tls(self.client_options)

    def __repr__(self) -> str:
        shown = mask_options(self.client_options)
        return (
            f"PoolConfig(replicas={self.replicas!r}, settings={self.settings!r}, client_options={shown!r}, "
            f"timeout_options={dict(self.timeout_options)!r}, health={self.health!r}, lag={self.lag!r}, "
            f"share_state={self.share_state!r}, attempts={self.attempts!r}, discovery={self.discovery!r}, "
            f"retry_budget={self.retry_budget!r}, read_your_writes={self.read_your_writes!r})"
        )


#: Every setting a pool takes by name: balancing, health probes, replica lag.
POOL_SETTING_NAMES: tuple[str, ...] = (
    *BALANCING_SETTING_NAMES, *HEALTH_SETTING_NAMES, *LAG_SETTING_NAMES, *DISCOVERY_SETTING_NAMES,
    *RETRY_BUDGET_SETTING_NAMES,
    *READ_YOUR_WRITES_SETTING_NAMES,
)
_OWN_SECTIONS = (
    *HEALTH_SETTING_NAMES, *LAG_SETTING_NAMES, *DISCOVERY_SETTING_NAMES, *RETRY_BUDGET_SETTING_NAMES,
    *READ_YOUR_WRITES_SETTING_NAMES,
)
#: ``compress=``: a boolean, or one of these algorithms (clickhouse-connect's).
COMPRESS_CHOICES = ("lz4", "zstd", "br", "brotli", "gzip", "deflate")
_BOOL_OPTIONS = frozenset(
    {"secure", "verify", "autogenerate_session_id", "apply_server_timezone", "show_clickhouse_errors"}
)
_STR_OPTIONS = frozenset({"username", "password", "database", "access_token", "ca_cert", "client_cert",
                          "client_cert_key", "server_host_name", "http_proxy", "https_proxy", "tls_mode"})


def check_client_option(name: str, value: Any) -> Any:
    """One clickhouse-connect option, checked before any I/O (the ones whose bad values would
    otherwise fail only at the first statement). A string from a DSN or URL becomes the type
    the client wants; a valid non-string value is returned unchanged."""
    if value is None:
        return None
    if name in LIMITS:
        number = bounded(name, value)
        return number if isinstance(value, str) else value
    if name in _BOOL_OPTIONS:
        return as_bool(name, value)
    if name in _STR_OPTIONS:
        if not isinstance(value, str):
            raise ConfigurationError(f"Bad {name} {shown(value)}: expected a string")
        return value
    if name == "compress":
        return _compress(value)
    if name == "pool_mgr" and isinstance(value, str):
        raise ConfigurationError(
            f"Bad pool_mgr {shown(value)}: pool_mgr takes a urllib3 PoolManager object, which a URL or DSN "
            "cannot carry; pass it in code: create_engine(..., connect_args={'pool_mgr': manager}) or "
            "get_pool(..., pool_mgr=manager)"
        )
    if name == "interface":
        if not isinstance(value, str) or value.strip().lower() not in ("http", "https"):
            raise ConfigurationError(f"Bad interface {shown(value)}: expected 'http' or 'https'")
        return value.strip().lower()
    if name == "settings":
        if not isinstance(value, Mapping) or not all(isinstance(key, str) and key for key in value):
            raise ConfigurationError(
                f"Bad settings {shown(value)}: expected a mapping of server setting names to values, "
                "such as settings={'max_threads': 4}"
            )
        return value
    return value


def _compress(value: Any) -> bool | str:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in COMPRESS_CHOICES:
            return text
        if text in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            return as_bool("compress", text)
    raise ConfigurationError(
        f"Bad compress {shown(value)}: expected true, false or one of {', '.join(COMPRESS_CHOICES)}"
    )


def resolve_pool_config(
    hosts: str | Replica | Iterable[str | Replica] | None,
    *,
    dsn: str | None,
    balancing: Mapping[str, Any],
    client_options: Mapping[str, Any],
    valid_client_options: frozenset[str],
    share_state: bool | str | int | None = None,
) -> PoolConfig:
    """Merge a DSN and keyword arguments (keywords win), validate every name and value.
    Health-check (``health_check_*``) and lag settings may come in ``balancing`` or among the
    client options (``**kwargs``); a DSN carries them as query parameters. ``share_state``:
    None takes the DSN's ``share_state=``, or True. ``hosts`` given with a ``dsn`` are the
    replicas (keywords win, as ``get_client(dsn=..., host=...)`` takes its ``host``); the DSN
    gives the rest (credentials, database, options).
    """
    options = dict(client_options)
    own = {name: options.pop(name) for name in _OWN_SECTIONS if name in options}
    options = create_client_spellings(options, valid_client_options)
    balancing = dict(balancing)
    own.update({name: balancing.pop(name) for name in _OWN_SECTIONS if name in balancing})
    own = {name: value for name, value in own.items() if value is not None}
    for name in options:
        if not isinstance(name, str):
            raise unknown_name_error("option", name, valid_client_options)
        if name in _POOL_OWNED:
            raise ConfigurationError(f"Option {name!r} is not accepted by a pool: {_POOL_OWNED[name]}")
        if name not in valid_client_options and name not in CLIENT_TIMEOUT_OPTIONS:
            raise unknown_name_error(
                "option", name,
                set(valid_client_options) | set(POOL_SETTING_NAMES) | set(CLIENT_TIMEOUT_OPTIONS) | {SHARE_STATE},
            )
    given = {name: value for name, value in balancing.items() if value is not None}
    replicas: list[Replica] = []
    if dsn is not None:
        parts = parse_dsn(dsn)
        replicas = parts.replicas
        merged_balancing = {**parts.balancing, **given}
        for name, value in (("username", parts.username), ("password", parts.password),
                            ("database", parts.database)):
            if value is not None and options.get(name) is None:
                options[name] = value
        if parts.secure and "secure" not in options and "interface" not in options:
            options["secure"] = True
        server_settings = dict(options.get("settings") or {})
        dsn_options = create_client_spellings(parts.options, valid_client_options)
        for name in _OWN_SECTIONS:
            if name in dsn_options:
                value = dsn_options.pop(name)
                own.setdefault(name, value)
        dsn_share_state = dsn_options.pop(SHARE_STATE, None)
        if share_state is None and dsn_share_state is not None:
            share_state = dsn_share_state
        if "username" in dsn_options and options.get("username") is None:
            options["username"] = dsn_options.pop("username")
        for name, value in dsn_options.items():
            if name in _POOL_OWNED:
                raise ConfigurationError(f"DSN option {name!r} is not accepted by a pool: {_POOL_OWNED[name]}")
            if name in valid_client_options or name in CLIENT_TIMEOUT_OPTIONS:
                options.setdefault(name, value)
            else:
                server_settings.setdefault(name, value)  # like clickhouse-connect: a server setting
        if server_settings:
            options["settings"] = server_settings
        given = merged_balancing
    if hosts is not None:
        replicas = parse_replicas(hosts, default_port=DEFAULT_HTTPS_PORT if uses_tls(options) else DEFAULT_HTTP_PORT)
    if not replicas:
        raise ConfigurationError(
            "No replicas given: pass hosts=['ch-1:8123', 'ch-2:8123'] or dsn='clickhouse://ch-1:8123,ch-2:8123/db'"
        )
    options = {name: check_client_option(name, value) for name, value in options.items()}
    given_timeouts = {name: options.pop(name) for name in CLIENT_TIMEOUT_OPTIONS if name in options}
    timeout_options = {name: parse_seconds(name, value) for name, value in given_timeouts.items() if value is not None}
    settings = parse_balancing_settings(given)
    health = parse_health_settings({k: v for k, v in own.items() if k in HEALTH_SETTING_NAMES})
    lag = parse_lag_settings({k: v for k, v in own.items() if k in LAG_SETTING_NAMES})
    discovery = parse_discovery_settings({k: v for k, v in own.items() if k in DISCOVERY_SETTING_NAMES})
    budget = parse_retry_budget_settings({k: v for k, v in own.items() if k in RETRY_BUDGET_SETTING_NAMES})
    ryw = parse_read_your_writes_settings({k: v for k, v in own.items() if k in READ_YOUR_WRITES_SETTING_NAMES})
    share = True if share_state is None else as_bool(SHARE_STATE, share_state)
    return PoolConfig(
        replicas, settings, options, health, lag,
        share_state=share, discovery=discovery, timeout_options=timeout_options, retry_budget=budget,
        read_your_writes=ryw,
    )
