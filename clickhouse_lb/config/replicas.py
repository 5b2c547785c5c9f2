"""The replicas of a pool: :class:`Replica`, host strings and multi-host DSNs (pure).

``"ch-1:8123,ch-2"``, ``["[::1]:8123", Replica("ch-3", priority=0)]`` or
``clickhouse://user:pw@ch-1,ch-2:8123/db?priority=0,1`` all become a list of validated
:class:`Replica` objects; bad input raises a :class:`ConfigurationError` naming it (with any
credentials masked).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

import idna

from clickhouse_lb._redact import mask_credentials, redact_dsn, shown
from clickhouse_lb.config._values import as_bool, as_priority, parse_priorities
from clickhouse_lb.config.settings import BALANCING_SETTING_NAMES
from clickhouse_lb.errors import ConfigurationError

__all__ = [
    "DEFAULT_HTTPS_PORT",
    "DEFAULT_HTTP_PORT",
    "DsnParts",
    "Replica",
    "parse_dsn",
    "parse_host",
    "parse_replicas",
    "split_bracketed",
    "split_host_list",
]

DEFAULT_HTTP_PORT = 8123
DEFAULT_HTTPS_PORT = 8443


@dataclass(frozen=True)
class Replica:
    """One replica as configured: host string (compared by the hostname strategies as is,
    without DNS), HTTP port, and ``priority`` (lower is preferred, like ``<priority>`` in
    ``remote_servers``; default 1)."""

    host: str
    port: int = DEFAULT_HTTP_PORT
    priority: int = 1

    def __post_init__(self) -> None:
        host = check_host_name(self.host)
        if host != self.host:  # an internationalised name: kept as the ASCII name DNS resolves
            object.__setattr__(self, "host", host)
        port = self.port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ConfigurationError(f"Bad port {shown(port)} for replica {self.host!r}: expected 1..65535")
        as_priority(self.priority, f" for replica {self.host!r}")

    @property
    def address(self) -> str:
        """``host:port`` (IPv6 hosts in brackets): the name the pool uses for this replica."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.address


#: One DNS label (RFC 1123; '_' tolerated, as resolvers and Docker service names use it).
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
_MAX_HOST = 253


def check_host_name(host: object) -> str:
    """A replica host as the pool keeps it: a DNS name (RFC 1123 labels, at most 253
    characters, one trailing dot allowed), an IPv4 address, or an IPv6 address (without
    brackets; a ``%zone`` suffix allowed). An internationalised name (``bücher.example``)
    becomes its IDNA (punycode) form, ``xn--bcher-kva.example``, as urllib3 encodes it.
    Anything else (spaces, CR/LF, NUL, zero-width characters, ``host:port:port``,
    '999.1.1.1') is a ConfigurationError."""
    expected = "expected a host name (RFC 1123), an IPv4 address or an IPv6 address"
    if not isinstance(host, str) or not host:
        raise ConfigurationError(f"Bad replica host {shown(host)}: {expected}")
    if not host.isascii():
        host = _idna(host, expected)
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigurationError(
                f"Bad replica host {shown(mask_credentials(host))}: not an IPv6 address "
                "(write host:port, or an IPv6 address in brackets: [::1]:8123)"
            ) from None
        return host
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if all(label.isascii() and label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            raise ConfigurationError(f"Bad replica host {shown(host)}: not an IPv4 address") from None
        return host
    if len(name) > _MAX_HOST or not all(_LABEL.fullmatch(label) for label in labels):
        raise ConfigurationError(f"Bad replica host {shown(mask_credentials(host))}: {expected}")
    return host


def _idna(host: str, expected: str) -> str:
    try:
        return idna.encode(host.lower(), strict=True, std3_rules=True).decode("ascii")
    except (idna.IDNAError, UnicodeError) as exc:
        raise ConfigurationError(
            f"Bad replica host {shown(mask_credentials(host))}: {expected}, or an internationalised "
            f"host name IDNA accepts ({exc})"
        ) from None


def _parse_port(text: str, original: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 5 or not 0 < int(text) < 65536:
        plain = text.isascii() and text.isdigit() and len(text) < 12
        raise ConfigurationError(
            f"Bad port {text if plain else shown(text)} in host {shown(original)}: expected 1..65535"
        )
    return int(text)


def split_host_list(text: str, hint: str) -> list[str]:
    """``"ch-1:8123, ch-2"`` -> ``["ch-1:8123", "ch-2"]``; an empty entry (``ch-1,,ch-2``, a
    trailing comma) is refused, naming the list as written, then ``hint`` (the form to write)."""
    hosts = [h.strip() for h in text.split(",")]
    if not all(hosts):
        raise ConfigurationError(f"Empty host name in {shown(text)}: {hint}")
    return hosts


def split_bracketed(text: str, original: str | None = None) -> tuple[str, str]:
    """``"[::1]:8123"`` -> ``("::1", ":8123")``, ``"[::1]"`` -> ``("::1", "")``: an IPv6 address
    in brackets and what follows them. Anything else that starts with ``[`` (no closing bracket,
    no ``:`` inside, text after the bracket that is not ``:port``) is refused, naming
    ``original`` (``text`` by default) as the user wrote it."""
    host, sep, rest = text[1:].partition("]")
    if not text.startswith("[") or not sep or (rest and not rest.startswith(":")) or ":" not in host:
        raise ConfigurationError(
            f"Bad host {shown(text if original is None else original)}: expected [ipv6]:port or [ipv6] "
            "(an IPv6 address in brackets, such as [::1]:8123)"
        )
    return host, rest


def parse_host(text: object, default_port: int = DEFAULT_HTTP_PORT, priority: int = 1) -> Replica:
    """``"ch-1:8123"``, ``"ch-1"``, ``"[::1]:8123"``, ``"::1"`` -> :class:`Replica`."""
    if not isinstance(text, str):
        raise ConfigurationError(f"Bad host {shown(text)}: expected a string 'host:port' or a clickhouse_lb.Replica")
    original = text
    text = text.strip()
    if not text:
        raise ConfigurationError(f"Bad host {original!r}: empty")
    if "@" in text or "://" in text or "?" in text or "#" in text or "=" in text:
        raise ConfigurationError(
            f"Bad host {shown(mask_credentials(text))}: a host is 'host:port'; give credentials as "
            "username=/password=, or the whole URL as dsn="
        )
    if text.startswith("["):
        host, rest = split_bracketed(text, original)
        port = _parse_port(rest[1:], original) if rest else default_port
        return Replica(host, port, priority)
    if text.count(":") > 1:  # a bare IPv6 address, without a port
        try:
            ipaddress.IPv6Address(text)
        except ValueError:
            raise ConfigurationError(
                f"Bad host {shown(original)}: more than one ':' but not an IPv6 address "
                "(write host:port, or [ipv6]:port)"
            ) from None
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
    elif isinstance(hosts, Iterable) and not isinstance(hosts, (bytes, bytearray, Mapping)):
        items = list(hosts)
    else:
        raise ConfigurationError(
            f"Bad hosts {shown(hosts)}: expected 'h1:8123,h2:8123', a list of 'host:port' strings "
            "and clickhouse_lb.Replica objects, or one Replica"
        )
    flat: list[str | Replica] = []
    for item in items:
        if isinstance(item, str):
            flat.extend(part for part in item.split(",") if part.strip())
        elif isinstance(item, Replica):
            flat.append(item)
        else:
            raise ConfigurationError(f"Bad host {shown(item)}: expected 'host:port' or clickhouse_lb.Replica")
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


def _check_raw_userinfo(dsn: str) -> None:
    """A password holding a raw '/', '?' or '#' ends the URL's authority early, and the rest
    would be read as hosts, ports or a database; refuse it, masked, with the fix."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        return
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority or "@" not in tail:
        return
    path_or_fragment = tail.split("?", 1)[0] + (tail.split("#", 1)[1] if "#" in tail else "")
    _user, colon, port = authority.partition(":")
    bad_port = colon and not (port.isascii() and port.isdigit())
    if "@" in path_or_fragment or bad_port:
        raise ConfigurationError(
            f"Bad dsn {shown(scheme + '://***@' + dsn.rpartition('@')[2])}: the user name or password seems "
            "to hold a raw '/', '?' or '#'; percent-encode them (urllib.parse.quote(password, safe=''))"
        )


def parse_dsn(dsn: str) -> DsnParts:
    """Parse a multi-host DSN. Hosts: ``h1:8123,h2:8123`` in the authority and/or repeated
    ``host=`` / ``alt_hosts=`` query parameters; ``priority=0,1,1`` gives per-host priorities.
    Balancing settings are taken by their ClickHouse names; every other query parameter is
    returned in ``options`` (clickhouse-connect client options or server settings)."""
    if not isinstance(dsn, str):
        raise ConfigurationError(
            f"Bad dsn {shown(dsn)}: expected a string such as 'clickhouse://user:pw@ch-1:8123,ch-2:8123/db'"
        )
    _check_raw_userinfo(dsn)
    try:
        parts = urlsplit(dsn)
    except ValueError as exc:
        raise ConfigurationError(f"Bad dsn {shown(redact_dsn(dsn))}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DSN_SCHEMES:
        raise ConfigurationError(
            f"Bad DSN scheme {shown(parts.scheme)}; valid: {', '.join(sorted(_DSN_SCHEMES))}"
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
    seen: set[str] = set()
    for key, value in query:
        if key in seen and key not in ("host", "alt_hosts"):
            raise ConfigurationError(f"DSN parameter {shown(key)} is given more than once: give it once")
        seen.add(key)
        if key in ("host", "alt_hosts"):
            hosts.extend(h for h in value.split(",") if h.strip())
        elif key == "priority":
            priorities = parse_priorities(value)
        elif key in ("secure", "https"):
            secure = as_bool(key, value)
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
