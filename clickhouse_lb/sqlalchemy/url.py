"""From a ``clickhousedb+lb://`` SQLAlchemy URL to one validated pool configuration.

The URL is read through SQLAlchemy's own :class:`~sqlalchemy.engine.URL` (user and password
come decoded, the database too, decoded here where SQLAlchemy < 2.1 does not; repeated query
parameters come as tuples); the replicas, balancing settings and client options are then
validated by the same code as ``get_pool``
(:func:`clickhouse_lb.config.pool_config.resolve_pool_config`), so the dialect accepts the same names and
fails the same way. Accepted forms::

    clickhousedb+lb://user:pw@/db?host=ch-1:8123&host=ch-2:8123      repeated host=
    clickhousedb+lb://user:pw@/db?host=ch-1&host=ch-2&port=8123&port=8124
                                      one port= per host= (or one for all): no ':' to encode
    clickhousedb+lb://user:pw@ch-1,ch-2,ch-3:8123/db                 one shared port
    clickhousedb+lb://user:pw@ch-1:8123/db?alt_hosts=ch-2:8123,ch-3:8123
    ...?secure=true (or https=true)      TLS; the default port becomes 8443
    ...?load_balancing=in_order&priority=0,1,1&distributed_replica_error_half_life=30

Hosts are taken in that order: the URL's authority, then ``host=`` values, then
``alt_hosts=`` values. SQLAlchemy renders a ``host=ch-1:8123`` value as ``host=ch-1%3A8123``, which
configparser (Alembic's ``config.set_main_option``) rejects as interpolation syntax; the
``port=`` form renders without any ``%`` (see docs/sqlalchemy.md). The parameters the dialect
owns (hosts, ``port``, ``priority``, ``secure``/``https``,
``autogenerate_session_id``, ``share_state`` and the balancing settings under their ClickHouse names) are taken
out; every other parameter goes on as clickhouse-connect's own dialect would treat it: a
clickhouse-connect client option when it names one, otherwise a server setting (a ``ch_``
prefix forces a server setting, e.g. ``ch_load_balancing`` for the server's own
``load_balancing`` of Distributed queries).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL

from clickhouse_lb.config._values import as_bool, parse_priorities
from clickhouse_lb.config.attempt_settings import CLIENT_TIMEOUT_OPTIONS
from clickhouse_lb.config.pool_config import (
    POOL_SETTING_NAMES,
    SHARE_STATE,
    PoolConfig,
    resolve_pool_config,
    sync_client_option_names,
)
from clickhouse_lb.config.replicas import (
    DEFAULT_HTTP_PORT,
    DEFAULT_HTTPS_PORT,
    Replica,
    parse_replicas,
    split_bracketed,
    split_host_list,
)
from clickhouse_lb.config.tls import uses_tls
from clickhouse_lb.errors import CONFIGURATION_REFERENCE, ConfigurationError, did_you_mean
from clickhouse_lb.sqlalchemy._compat import url_database

__all__ = ["DIALECT_PARAMETERS", "EngineArgs", "engine_args_from_url"]

#: Query parameters the dialect takes for itself (besides the balancing settings).
DIALECT_PARAMETERS = (
    "host", "port", "alt_hosts", "priority", "secure", "https", "autogenerate_session_id", SHARE_STATE,
)

# Names that can only be meant as balancing settings: an unknown one is a typo, not a server setting.
_BALANCING_PREFIXES = (
    "load_balancing", "distributed_replica_", "connections_with_failover", "failover_", "least_loaded", "health_check_",
)
# Real server settings that look like ours; they go to the server as they are.
_SERVER_LOOKALIKES = frozenset({"connect_timeout_with_failover_secure_ms"})
#: The form for hosts with ports of their own, named by every host error of the URL: SQLAlchemy's
#: own parser cannot read ``ch-1:8123,ch-2:9000`` in the host part (``ValueError: invalid literal
#: for int()`` from inside SQLAlchemy, before the dialect sees the URL).
PER_HOST_PORTS = "?host=ch-1:8123&host=ch-2:9000 (a port per host) or ch-1,ch-2:8123 (one port for all)"
# Options a pinned connection decides for itself.
_REFUSED = ("session_id", "dsn", "generic_args")


@dataclass(frozen=True)
class EngineArgs:
    """What an engine URL (plus ``connect_args``) says: the pool's configuration and whether each
    DB-API connection gets its own ClickHouse session."""

    config: PoolConfig
    session: bool
    #: The URL's balancing settings and client options, kept to merge ``connect_args`` into.
    balancing: dict[str, Any] = field(default_factory=dict, repr=False)
    client_options: dict[str, Any] = field(default_factory=dict, repr=False)
    #: The options the connections' client takes (the sync or the async client's).
    client_option_names: frozenset[str] = field(default_factory=frozenset, repr=False)

    def with_connect_args(self, connect_args: Mapping[str, Any]) -> EngineArgs:
        """The same engine with ``create_engine(connect_args=...)`` applied: balancing settings by
        their ClickHouse names, anything else as clickhouse-connect client options (a
        ``settings`` dict is merged into the URL's server settings)."""
        if not connect_args:
            return self
        balancing = dict(self.balancing)
        options = dict(self.client_options)
        session = self.session
        share_state: object = self.config.share_state
        for name, value in connect_args.items():
            if name in POOL_SETTING_NAMES:
                balancing[name] = value
            elif name == "autogenerate_session_id":
                session = as_bool(name, value)
            elif name == SHARE_STATE:
                share_state = value
            elif name == "settings" and isinstance(value, Mapping):
                options["settings"] = {**(options.get("settings") or {}), **value}
            else:
                options[name] = value
        return _resolve(
            self.config.replicas, balancing, options, session, self.client_option_names, share_state=share_state
        )


def _values(query: Mapping[str, str | tuple[str, ...]], name: str) -> list[str]:
    value = query.get(name)
    if value is None:
        return []
    return list(value) if isinstance(value, tuple) else [value]


def _single(query: Mapping[str, str | tuple[str, ...]], name: str) -> str | None:
    values = _values(query, name)
    if len(values) > 1:
        # The values are not shown: the parameter may be a password.
        raise ConfigurationError(f"URL parameter {name!r} is given {len(values)} times: give it once")
    return values[0] if values else None


def _check_not_a_typo(name: str) -> None:
    """An unknown parameter that can only be meant as a balancing setting is an error here,
    rather than a server setting the server rejects at the first query."""
    if name in _SERVER_LOOKALIKES:
        return
    valid = sorted((*POOL_SETTING_NAMES, *DIALECT_PARAMETERS))
    close = difflib.get_close_matches(name, valid, n=5, cutoff=0.85)
    if close or name.startswith(_BALANCING_PREFIXES):
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigurationError(
            f"Unknown balancing parameter {name!r} in the URL.{hint} Every parameter is in the configuration "
            f"reference: {CONFIGURATION_REFERENCE}. (To send a server setting of that name, write ch_{name}=...)"
        )


def _authority_hosts(url: URL) -> list[str]:
    """``ch-1,ch-2,ch-3:8123``: SQLAlchemy splits it into host ``ch-1,ch-2,ch-3`` and port 8123;
    the port is shared by every host of the authority."""
    if not url.host:
        if url.port is not None:
            raise ConfigurationError(f"The URL gives port {url.port} but no host before it: write {PER_HOST_PORTS}")
        return []
    hosts = split_host_list(url.host, f"write {PER_HOST_PORTS}")
    if url.port is None:
        return hosts
    return [f"[{h}]:{url.port}" if ":" in h else f"{h}:{url.port}" for h in hosts]


def _split_own_port(host: str) -> tuple[str, bool]:
    """A ``host=`` value as its bare host and whether it has a port of its own; a malformed
    bracketed one (``[::1`` with no ``]``) is refused as written, never cut to another host."""
    if host.startswith("["):
        bare, rest = split_bracketed(host)
        return bare, bool(rest)
    return host, host.count(":") == 1


def _with_ports(hosts: list[str], ports: list[str]) -> list[str]:
    """``host=`` values given their ``port=`` values: one port for every host without one of its
    own, or one per host in order (a host that already has a port may not get another, and a
    port no host takes is refused)."""
    if not hosts:
        raise ConfigurationError(f"The URL gives port={ports[0]} but no host= before it: write {PER_HOST_PORTS}")
    if len(ports) not in (1, len(hosts)):
        raise ConfigurationError(
            f"The URL gives {len(ports)} port= values for {len(hosts)} host= values: give one per host, or one for "
            f"all (or write {PER_HOST_PORTS})"
        )
    split = [_split_own_port(host) for host in hosts]
    if len(ports) == 1 and all(own for _, own in split):
        raise ConfigurationError(
            f"The URL gives port={ports[0]} but every host= has a port of its own ({', '.join(hosts)}), so no host "
            f"takes it: give each host's port once ({PER_HOST_PORTS})"
        )
    paired = []
    for i, (host, (bare, own)) in enumerate(zip(hosts, split)):
        port = ports[0 if len(ports) == 1 else i]
        if own:
            if len(ports) == 1:
                paired.append(host)  # a port of its own; the shared one is for the hosts without
                continue
            raise ConfigurationError(
                f"Host {host!r} has a port and is also given port={port}: give it once ({PER_HOST_PORTS})"
            )
        paired.append(f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}")
    return paired


def _resolve(
    replicas: list[Replica],
    balancing: dict[str, Any],
    options: dict[str, Any],
    session: bool,
    client_option_names: frozenset[str],
    *,
    share_state: object = None,
) -> EngineArgs:
    for name in _REFUSED:
        if name in options:
            raise ConfigurationError(
                f"Option {name!r} is not accepted by clickhousedb+lb: each DB-API connection gets its "
                "own ClickHouse session on its own replica (autogenerate_session_id=false turns sessions off)"
            )
    config = resolve_pool_config(
        replicas,
        dsn=None,
        balancing=balancing,
        client_options=options,
        valid_client_options=client_option_names,
        share_state=None if share_state is None else as_bool(SHARE_STATE, share_state),
    )
    return EngineArgs(config, session, balancing, options, client_option_names)


def engine_args_from_url(
    url: URL,
    default_session: bool = True,
    *,
    client_option_names: frozenset[str] | None = None,
    other_client_option_names: frozenset[str] = frozenset(),
    scheme: str = "clickhousedb+lb",
) -> EngineArgs:
    """Validate an engine URL; raises :class:`~clickhouse_lb.errors.ConfigurationError` naming
    the bad value (and the valid choices, where there is a closed set). ``client_option_names``:
    the options the connections' client takes (default: the sync client's);
    ``other_client_option_names``: options of the other clickhouse-connect client, refused here
    rather than sent to the server as settings; ``scheme`` names the dialect in messages."""
    if client_option_names is None:
        client_option_names = sync_client_option_names()
    query = url.query
    hosts = _authority_hosts(url)
    query_hosts = [h.strip() for value in _values(query, "host") for h in value.split(",") if h.strip()]
    ports = [p.strip() for value in _values(query, "port") for p in value.split(",") if p.strip()]
    hosts.extend(_with_ports(query_hosts, ports) if ports else query_hosts)
    hosts.extend(h for value in _values(query, "alt_hosts") for h in value.split(",") if h.strip())
    if not hosts:
        shown = url.render_as_string(hide_password=True)
        raise ConfigurationError(
            f"No hosts in URL {shown!r}: expected {scheme}://user:pw@ch-1,ch-2:8123/db (one port for all) "
            f"or {scheme}://user:pw@/db?host=ch-1:8123&host=ch-2:9000 (a port per host)"
        )
    flags = [as_bool(name, value) for name in ("secure", "https") if (value := _single(query, name)) is not None]
    interface = _single(query, "interface")
    if interface is not None and interface.strip().lower() not in ("http", "https"):
        raise ConfigurationError(
            f"Bad interface {interface!r}{did_you_mean(interface, ('http', 'https'))}: expected http or https"
        )
    secure = uses_tls({"secure": any(flags), "interface": interface})
    session_text = _single(query, "autogenerate_session_id")
    session = default_session if session_text is None else as_bool("autogenerate_session_id", session_text)
    # One list (priority=0,1,1) or one value per host (priority=0&priority=1&priority=1: the
    # form the engine renders, commas being encoded as %2C).
    priority = ",".join(_values(query, "priority")) or None
    replicas = parse_replicas(
        hosts,
        default_port=DEFAULT_HTTPS_PORT if secure else DEFAULT_HTTP_PORT,
        priorities=None if priority is None else parse_priorities(priority),
    )

    balancing: dict[str, Any] = {}
    options: dict[str, Any] = {}
    settings: dict[str, str] = {}
    for name in query:
        if name in DIALECT_PARAMETERS:
            continue
        value = _single(query, name)
        if name in POOL_SETTING_NAMES:
            balancing[name] = value
        elif name in _REFUSED:
            options[name] = value  # refused by _resolve, with the reason
        elif name.startswith("ch_"):
            settings[name[3:]] = str(value)
        elif name in client_option_names or name in other_client_option_names or name in CLIENT_TIMEOUT_OPTIONS:
            # the other client's options are refused by _resolve, naming the valid ones; the
            # timeouts (receive_timeout, send_timeout too) are the pool's, in fractional seconds
            options[name] = value
        elif name == "compression":  # clickhouse-connect's URL spelling of `compress`
            options.setdefault("compress", value)
        else:
            _check_not_a_typo(name)
            settings[name] = str(value)
    for name, given in (("username", url.username), ("password", url.password), ("database", url_database(url))):
        if given:
            options[name] = given
    if secure:
        options["secure"] = True
    if settings:
        options["settings"] = settings
    return _resolve(replicas, balancing, options, session, client_option_names, share_state=_single(query, SHARE_STATE))
