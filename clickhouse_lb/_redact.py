"""Keep secrets out of every log line, repr and exception message the library writes.

The one place that knows what a secret looks like: in free text (:func:`redact`), in a host
string (:func:`mask_credentials`) and in a DSN (:func:`redact_dsn`).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

__all__ = ["mask_credentials", "redact", "redact_dsn"]

_SECRET_PARAM = re.compile(
    r"(?i)\b(password|passwd|pwd|access_token|token|key|secret|insert_deduplication_token)=([^&\s'\",)]+)"
)
_URL_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)@")
_AUTH_HEADER = re.compile(r"(?i)\b(authorization|x-clickhouse-key)(['\"]?\s*[:=]\s*['\"]?)([^'\",\s]+(?: [^'\",\s]+)?)")


def redact(text: str) -> str:
    """Mask passwords and tokens in URLs, query strings and header dumps."""
    text = _URL_USERINFO.sub(r"\1***@", text)
    text = _SECRET_PARAM.sub(r"\1=***", text)
    return _AUTH_HEADER.sub(r"\1\2***", text)


def mask_credentials(text: str) -> str:
    """``user:secret@host`` -> ``***@host`` (also inside URLs), for messages."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    return f"{scheme}{sep}{rest}"


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
