"""Keep secrets out of every log line, repr, event, CLI line and exception message.

The one place that knows what a secret looks like. :func:`redact` is the one function every
message that can contain user input goes through (every :class:`ConfigurationError` applies it
to its own message, so no construction site can forget); :func:`shown` is how a bad value is
quoted in a message (redacted, and cut short). :func:`mask_credentials` (a host string),
:func:`redact_dsn` (a DSN) and :func:`mask_options` (client options) are the structured
maskers, for the places that know what they hold.

What :func:`redact` masks:

* the password of a URL's userinfo (``scheme://user:***@host``), even when it holds raw
  ``@ # ? / % :`` (everything up to the last ``@`` of the word is masked);
* secret parameters in query strings and ``key=value`` text (``password=``, ``access_token=``,
  ``token=``, ``secret=``, ``key=``, ``insert_deduplication_token=`` ...);
* the same names as dict or JSON items (``'password': 'x'``, ``"token": 12``) and in
  ``name: value`` text (``password: x``; not ``key``, ``token`` or ``pass`` unquoted, which are
  words of the pool's own messages: "the sharding key: its data"). A quoted name followed by prose
  is a quoted value, not an item ("Bad failover_timeout 'token': expected ...");
* ``Authorization:`` / ``X-ClickHouse-Key:`` header values (``Bearer``/``Basic`` included);
* JSON Web Tokens anywhere (``eyJ....eyJ....sig``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

__all__ = ["SECRET_NAMES", "brief", "mask_credentials", "mask_options", "redact", "redact_dsn", "shown"]

#: Parameter names whose values are secrets, wherever they appear (query strings, key=value,
#: dicts, DSN parameters).
SECRET_NAMES = (
    "password", "passwd", "pwd", "pass", "access_token", "token", "secret", "key", "api_key",
    "client_cert_key", "jwt", "insert_deduplication_token",
)
_NAMES = "|".join(sorted(SECRET_NAMES, key=len, reverse=True))
#: Names that are also plain English words ("the sharding key: its data"): unquoted, not secrets.
_PROSE_WORDS = frozenset({"key", "token", "pass"})
_UNQUOTED_NAMES = "|".join(sorted(set(SECRET_NAMES) - _PROSE_WORDS, key=len, reverse=True))
# scheme://user:<password>@ -- the password runs to the last '@' of the word, so raw '@', '#',
# '?', '/', ':' and '%' in it are masked too (over-masking an odd URL is the safe side).
_URL_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s:@/?#]*:)\S*@")
_SECRET_PARAM = re.compile(rf"(?i)\b({_NAMES})=([^&\s'\",)}}\]]+)")
_ITEM_VALUE = r"""'[^']*'|"[^"]*"|b'[^']*'"""
# password: x, access_token: "x" (header or YAML style): any value.
_SECRET_FIELD = re.compile(rf"(?i)(?<![\w'\"])((?:{_UNQUOTED_NAMES})\s*:\s*)({_ITEM_VALUE}|[^\s,}})\]]+)")
# 'password': 'x', "token": 12 (a dict's or JSON's item): a quoted value, or a bare one that ends
# the item. Not a quoted name followed by prose: the pool's messages quote a bad value that way
# ("Bad failover_timeout 'token': expected a number ...").
_SECRET_ITEM = re.compile(
    rf"(?i)(['\"](?:{_NAMES})['\"]\s*:\s*)({_ITEM_VALUE}|[^\s,}})\]'\"]+(?=\s*(?:[,}})\]]|$)))"
)
_AUTH_HEADER = re.compile(
    r"(?i)\b(authorization|x-clickhouse-key|proxy-authorization)(['\"]?\s*[:=]\s*['\"]?)"
    r"((?:bearer |basic )?[^'\",\s]+)"
)
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")

#: The longest quoted value a message shows (a 10 MB string is not a message).
_SHOWN_LIMIT = 200


def redact(text: str) -> str:
    """Mask passwords and tokens in URLs, query strings, ``key=value`` and dict-style text,
    header dumps and JWTs."""
    text = _URL_USERINFO.sub(r"\1***@", text)
    text = _JWT.sub("***", text)
    text = _AUTH_HEADER.sub(r"\1\2***", text)
    text = _SECRET_PARAM.sub(r"\1=***", text)
    text = _SECRET_FIELD.sub(r"\1'***'", text)
    return _SECRET_ITEM.sub(r"\1'***'", text)


#: The longest failure description a log line or an error message carries (per replica).
BRIEF_LIMIT = 300
# A request URL's query string: the pool's whole settings (date_time_input_format=...&...), a
# query_id, the SQL itself. The path and the host stay.
_URL_QUERY = re.compile(r"(\burl: /[^\s?]*|\bhttps?://[^\s/?#]+[^\s?#]*)\?[^\s)'\"]*")
# urllib3's connection objects as they name themselves in messages: only their address matters.
_CONNECTION_REPR = re.compile(r"\b_?\w*HTTPS?Connection(?:Pool)?\(host='([^']*)', port=(\d+)\)")


def brief(text: str, limit: int = BRIEF_LIMIT) -> str:
    """A failure description fit for one log line: redacted, without request URLs' query
    strings, urllib3's connection reprs shortened to ``host:port``, on one line, at most
    ``limit`` characters."""
    text = redact(text)
    text = _URL_QUERY.sub(r"\1", text)
    text = _CONNECTION_REPR.sub(r"\1:\2", text)
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 5] + "[...]"
    return text


def shown(value: object) -> str:
    """A user's value as an error message quotes it: ``repr``, redacted, cut short."""
    text = redact(repr(value))
    if len(text) > _SHOWN_LIMIT:
        text = text[: _SHOWN_LIMIT - 5] + "[...]"
    return text


def mask_credentials(text: str) -> str:
    """``user:secret@host`` -> ``***@host`` (also inside URLs), for messages."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    return redact(f"{scheme}{sep}{rest}")


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (for messages and logs)."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return redact(dsn)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.partition(":")[0] + ":***"
    netloc = f"{userinfo}@{hostlist}" if at else hostlist
    query = "&".join(
        f"{k}=***" if k.lower() in SECRET_NAMES else f"{k}={v}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    return redact(parts._replace(netloc=netloc, query=query).geturl())


#: clickhouse-connect options whose values are secrets (or may carry them).
SECRET_OPTIONS = frozenset({"password", "access_token", "token_provider", "client_cert_key", "headers"})


def mask_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Client options with every secret value shown as ``***`` (for reprs)."""
    return {k: ("***" if k in SECRET_OPTIONS and v else v) for k, v in options.items()}
