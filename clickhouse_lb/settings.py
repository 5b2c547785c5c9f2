"""The balancing settings, under ClickHouse's own names, and the replica list.

Everything here is pure: values come in from keyword arguments, a DSN, a SQLAlchemy URL
query or a statement's ``settings=``; they leave as one frozen :class:`BalancingSettings`
(or a :class:`StatementOverrides`) or as a :class:`ConfigurationError` that names the bad
value and the valid choices. Strings are accepted everywhere a number is, because URLs only
carry strings.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .errors import ConfigurationError, did_you_mean

__all__ = [
    "BALANCING_SETTING_NAMES",
    "STATEMENT_SETTING_NAMES",
    "BalancingSettings",
    "DsnParts",
    "LoadBalancing",
    "Replica",
    "StatementOverrides",
    "parse_balancing_settings",
    "parse_dsn",
    "parse_replicas",
    "split_statement_settings",
]

DEFAULT_HTTP_PORT = 8123
DEFAULT_HTTPS_PORT = 8443


class LoadBalancing(str, Enum):
    """ClickHouse's ``load_balancing`` values (src/Core/SettingsEnums.h)."""

    RANDOM = "random"
    NEAREST_HOSTNAME = "nearest_hostname"
    HOSTNAME_LEVENSHTEIN_DISTANCE = "hostname_levenshtein_distance"
    HOSTNAME_LONGEST_COMMON_PREFIX = "hostname_longest_common_prefix"
    HOSTNAME_LONGEST_COMMON_SUFFIX = "hostname_longest_common_suffix"
    IN_ORDER = "in_order"
    FIRST_OR_RANDOM = "first_or_random"
    ROUND_ROBIN = "round_robin"

    @classmethod
    def parse(cls, value: object) -> LoadBalancing:
        """Case-insensitive, like the server; an unknown name lists the valid ones."""
        if isinstance(value, LoadBalancing):
            return value
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                pass
        choices = [m.value for m in cls]
        raise ConfigurationError(
            f"Unknown load_balancing {value!r}{did_you_mean(value, choices)}; valid choices: {', '.join(choices)}"
        )

    @property
    def uses_hostnames(self) -> bool:
        return self in _HOSTNAME_STRATEGIES


_HOSTNAME_STRATEGIES = frozenset(
    {
        LoadBalancing.NEAREST_HOSTNAME,
        LoadBalancing.HOSTNAME_LEVENSHTEIN_DISTANCE,
        LoadBalancing.HOSTNAME_LONGEST_COMMON_PREFIX,
        LoadBalancing.HOSTNAME_LONGEST_COMMON_SUFFIX,
    }
)


@dataclass(frozen=True)
class Replica:
    """One replica as configured: host string (compared by the hostname strategies as is,
    without DNS), HTTP port, and ``priority`` (lower is preferred, like ``<priority>`` in
    ``remote_servers``; default 1)."""

    host: str
    port: int = DEFAULT_HTTP_PORT
    priority: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host or any(c in self.host for c in " /@?#,"):
            shown = mask_credentials(self.host) if isinstance(self.host, str) else self.host
            raise ConfigurationError(f"Bad replica host {shown!r}: expected a host name or IP address")
        port = self.port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ConfigurationError(f"Bad port {port!r} for replica {self.host!r}: expected 1..65535")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ConfigurationError(f"Bad priority {self.priority!r} for replica {self.host!r}: expected an integer")

    @property
    def address(self) -> str:
        """``host:port`` (IPv6 hosts in brackets): the name the pool uses for this replica."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.address


def mask_credentials(text: str) -> str:
    """``user:secret@host`` -> ``***@host`` (also inside URLs), for messages."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    return f"{scheme}{sep}{rest}"


def _parse_port(text: str, original: str) -> int:
    if not text.isdigit():
        raise ConfigurationError(f"Bad port {text!r} in host {original!r}: expected 1..65535")
    port = int(text)
    if not 0 < port < 65536:
        raise ConfigurationError(f"Bad port {port} in host {original!r}: expected 1..65535")
    return port


def parse_host(text: str, default_port: int = DEFAULT_HTTP_PORT, priority: int = 1) -> Replica:
    """``"ch-1:8123"``, ``"ch-1"``, ``"[::1]:8123"``, ``"::1"`` -> :class:`Replica`."""
    original = text
    text = text.strip()
    if not text:
        raise ConfigurationError(f"Bad host {original!r}: empty")
    if "@" in text or "://" in text:
        raise ConfigurationError(
            f"Bad host {mask_credentials(text)!r}: a host is 'host:port'; give credentials as "
            "username=/password=, or the whole URL as dsn="
        )
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ConfigurationError(f"Bad host {original!r}: expected [ipv6]:port")
        port = _parse_port(rest[1:], original) if rest else default_port
        return Replica(host, port, priority)
    if text.count(":") > 1:  # a bare IPv6 address
        return Replica(text, default_port, priority)
    host, sep, port_text = text.partition(":")
    port = _parse_port(port_text, original) if sep else default_port
    return Replica(host, port, priority)


def parse_replicas(
    hosts: str | Replica | Iterable[str | Replica],
    *,
    default_port: int = DEFAULT_HTTP_PORT,
    priorities: Sequence[int] | None = None,
) -> list[Replica]:
    """Normalise ``hosts`` (a comma-separated string, or a list of strings and Replicas)."""
    if isinstance(hosts, (str, Replica)):
        items: list[str | Replica] = [hosts]
    else:
        items = list(hosts)
    flat: list[str | Replica] = []
    for item in items:
        if isinstance(item, str):
            flat.extend(part for part in item.split(",") if part.strip())
        elif isinstance(item, Replica):
            flat.append(item)
        else:
            raise ConfigurationError(f"Bad host {item!r}: expected 'host:port' or clickhouse_lb.Replica")
    if not flat:
        raise ConfigurationError("No replicas given: pass hosts=['ch-1:8123', ...] or a dsn with hosts")
    if priorities is not None and len(priorities) not in (1, len(flat)):
        raise ConfigurationError(
            f"priority has {len(priorities)} values for {len(flat)} hosts: give one per host, or one for all"
        )
    replicas: list[Replica] = []
    for i, item in enumerate(flat):
        prio = 1 if priorities is None else priorities[0 if len(priorities) == 1 else i]
        replicas.append(item if isinstance(item, Replica) else parse_host(item, default_port, prio))
    seen: dict[str, int] = {}
    for i, replica in enumerate(replicas):
        key = replica.address.lower()
        if key in seen:
            raise ConfigurationError(
                f"Duplicate replica {replica.address!r} (positions {seen[key]} and {i}): each replica once"
            )
        seen[key] = i
    return replicas


def _as_int(name: str, value: object, *, minimum: int | None = 0) -> int:
    if isinstance(value, bool):
        raise ConfigurationError(f"Bad {name} {value!r}: expected an integer")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            raise ConfigurationError(f"Bad {name} {text!r}: expected an integer") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise ConfigurationError(f"Bad {name} {value!r}: expected an integer")
    if minimum is not None and value < minimum:
        raise ConfigurationError(f"Bad {name} {value!r}: must be >= {minimum}")
    return value


def _as_seconds(name: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, str):
        text = value.strip()
        if allow_none and text.lower() in ("", "none", "0"):
            return None
        try:
            value = float(text)
        except ValueError:
            raise ConfigurationError(f"Bad {name} {text!r}: expected a number of seconds") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"Bad {name} {value!r}: expected a number of seconds")
    if math.isnan(value) or value < 0:
        raise ConfigurationError(f"Bad {name} {value!r}: must be >= 0")
    if allow_none and value == 0:
        return None
    return float(value)


def _as_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    words = ("1", "true", "yes", "on", "0", "false", "no", "off")
    if isinstance(value, str) and value.strip().lower() in words:
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise ConfigurationError(f"Bad {name} {value!r}{did_you_mean(value, words)}: expected true or false")


@dataclass(frozen=True)
class BalancingSettings:
    """How a pool orders, counts and fails over. Names and defaults are ClickHouse's
    (src/Core/Settings.cpp), except the three ``failover_*``/``auto_*`` options, which the
    server has no equivalent for."""

    load_balancing: LoadBalancing = LoadBalancing.RANDOM
    load_balancing_first_offset: int = 0
    local_hostname: str | None = None
    distributed_replica_error_half_life: float = 60.0
    distributed_replica_error_cap: int = 1000
    distributed_replica_max_ignored_errors: int = 0
    connections_with_failover_max_tries: int = 3
    connect_timeout_with_failover_ms: int = 1000
    #: Pause before each new pass over the replicas (exponential, with full jitter); 0: none.
    failover_backoff_ms: int = 0
    #: Total time budget of one statement's attempts in seconds; None: bounded by tries only.
    failover_timeout: float | None = None
    #: Add a stable ``insert_deduplication_token`` to inserts so that they can be retried safely.
    auto_insert_deduplication_token: bool = True


BALANCING_SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(BalancingSettings))

_INT_SETTINGS = {
    "load_balancing_first_offset": None,  # any integer: taken modulo n
    "distributed_replica_error_cap": 0,
    "distributed_replica_max_ignored_errors": 0,
    "connections_with_failover_max_tries": 1,
    "connect_timeout_with_failover_ms": 1,
    "failover_backoff_ms": 0,
}


def unknown_name_error(kind: str, name: str, valid: Iterable[str]) -> ConfigurationError:
    """An error for an unknown option: the name, the closest valid names, and where the list is."""
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return ConfigurationError(f"Unknown {kind} {name!r}.{hint} Valid: {', '.join(valid)}")


def parse_balancing_settings(values: Mapping[str, Any]) -> BalancingSettings:
    """Validate balancing settings given by name (strings allowed); unknown names are errors."""
    parsed: dict[str, Any] = {}
    for name, value in values.items():
        if name not in BALANCING_SETTING_NAMES:
            raise unknown_name_error("balancing setting", name, BALANCING_SETTING_NAMES)
        if name == "load_balancing":
            parsed[name] = LoadBalancing.parse(value)
        elif name == "local_hostname":
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigurationError(f"Bad local_hostname {value!r}: expected a non-empty host name")
            parsed[name] = value.strip() if isinstance(value, str) else None
        elif name == "distributed_replica_error_half_life":
            parsed[name] = _as_seconds(name, value)
        elif name == "failover_timeout":
            parsed[name] = _as_seconds(name, value, allow_none=True)
        elif name == "auto_insert_deduplication_token":
            parsed[name] = _as_bool(name, value)
        else:
            parsed[name] = _as_int(name, value, minimum=_INT_SETTINGS[name])
    return BalancingSettings(**parsed)


#: Balancing settings a statement may change for itself through ``settings=``, as on the server.
STATEMENT_SETTING_NAMES = frozenset(
    {"load_balancing", "load_balancing_first_offset", "distributed_replica_max_ignored_errors"}
)


@dataclass(frozen=True)
class StatementOverrides:
    """Balancing settings given for one statement (``None``: use the pool's)."""

    load_balancing: LoadBalancing | None = None
    load_balancing_first_offset: int | None = None
    distributed_replica_max_ignored_errors: int | None = None

    def __bool__(self) -> bool:
        return (
            self.load_balancing is not None
            or self.load_balancing_first_offset is not None
            or self.distributed_replica_max_ignored_errors is not None
        )


NO_OVERRIDES = StatementOverrides()


def split_statement_settings(
    settings: Mapping[str, Any] | None,
) -> tuple[StatementOverrides, Mapping[str, Any] | None]:
    """Take the balancing settings out of a statement's ``settings``; the rest go to the server
    (the same object when there is nothing to take out)."""
    if not settings or not any(key in STATEMENT_SETTING_NAMES for key in settings):
        return NO_OVERRIDES, settings
    rest = {k: v for k, v in settings.items() if k not in STATEMENT_SETTING_NAMES}
    lb = settings.get("load_balancing")
    offset = settings.get("load_balancing_first_offset")
    ignored = settings.get("distributed_replica_max_ignored_errors")
    overrides = StatementOverrides(
        load_balancing=LoadBalancing.parse(lb) if lb is not None else None,
        load_balancing_first_offset=(
            _as_int("load_balancing_first_offset", offset, minimum=None) if offset is not None else None
        ),
        distributed_replica_max_ignored_errors=(
            _as_int("distributed_replica_max_ignored_errors", ignored) if ignored is not None else None
        ),
    )
    return overrides, rest


@dataclass(frozen=True)
class DsnParts:
    """What a multi-host DSN says: ``clickhouse://user:pw@h1:8123,h2:8123/db?load_balancing=in_order``."""

    replicas: list[Replica]
    username: str | None
    password: str | None
    database: str | None
    secure: bool
    balancing: dict[str, str]
    options: dict[str, str]


_DSN_SCHEMES = {
    "clickhouse": False,
    "clickhousedb": False,
    "http": False,
    "clickhouse+http": False,
    "https": True,
    "clickhouses": True,
    "clickhouse+https": True,
}


def parse_dsn(dsn: str) -> DsnParts:
    """Parse a multi-host DSN. Hosts: ``h1:8123,h2:8123`` in the authority and/or repeated
    ``host=`` / ``alt_hosts=`` query parameters; ``priority=0,1,1`` gives per-host priorities.
    Balancing settings are taken by their ClickHouse names; every other query parameter is
    returned in ``options`` (clickhouse-connect client options or server settings)."""
    parts = urlsplit(dsn)
    scheme = parts.scheme.lower()
    if scheme not in _DSN_SCHEMES:
        raise ConfigurationError(
            f"Bad DSN scheme {parts.scheme!r}; valid: {', '.join(sorted(_DSN_SCHEMES))}"
        )
    secure = _DSN_SCHEMES[scheme]
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, sep, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if sep else None
    query = parse_qsl(parts.query, keep_blank_values=True)
    hosts: list[str] = [h for h in hostlist.split(",") if h.strip()] if hostlist else []
    balancing: dict[str, str] = {}
    options: dict[str, str] = {}
    priorities: list[int] | None = None
    for key, value in query:
        if key in ("host", "alt_hosts"):
            hosts.extend(h for h in value.split(",") if h.strip())
        elif key == "priority":
            priorities = [_as_int("priority", p, minimum=None) for p in value.split(",")]
        elif key in ("secure", "https"):
            secure = _as_bool(key, value)
        elif key in BALANCING_SETTING_NAMES:
            balancing[key] = value
        else:
            options[key] = value
    if not hosts:
        raise ConfigurationError(f"No hosts in DSN {redact_dsn(dsn)!r}: expected clickhouse://h1:8123,h2:8123/db")
    default_port = DEFAULT_HTTPS_PORT if secure else DEFAULT_HTTP_PORT
    # A shared port written once at the end (ch-1,ch-2,ch-3:8123) applies to every bare host.
    last_host = hosts[-1] if hostlist else ""
    if hostlist and ":" in last_host and not last_host.startswith("[") and last_host.count(":") == 1:
        shared_port = last_host.rpartition(":")[2]
        authority_hosts = [h for h in hostlist.split(",") if h.strip()]
        if all(":" not in h for h in authority_hosts[:-1]) and len(authority_hosts) > 1:
            hosts = [f"{h}:{shared_port}" if h in authority_hosts[:-1] else h for h in hosts]
    replicas = parse_replicas(hosts, default_port=default_port, priorities=priorities)
    path = unquote(parts.path.lstrip("/"))
    database = path or None
    return DsnParts(replicas, username, password, database, secure, balancing, options)


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (for messages and logs)."""
    parts = urlsplit(dsn)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.partition(":")[0] + ":***"
    netloc = f"{userinfo}@{hostlist}" if at else hostlist
    query = "&".join(
        f"{k}=***" if k.lower() in ("password", "access_token", "key") else f"{k}={v}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    return parts._replace(netloc=netloc, query=query).geturl()
