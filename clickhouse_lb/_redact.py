"""Keep secrets out of every log line, repr and exception message the library writes.

The one place that knows what a secret looks like: in free text (:func:`redact`), in a host
string (:func:`mask_credentials`), in a DSN (:func:`redact_dsn`) and among client options
(:func:`mask_options`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

__all__ = ["mask_credentials", "mask_options", "redact", "redact_dsn"]

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


#: clickhouse-connect options whose values are secrets (or may carry them).
SECRET_OPTIONS = frozenset({"password", "access_token", "token_provider", "client_cert_key", "headers"})


def mask_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Client options with every secret value shown as ``***`` (for reprs)."""
    return {k: ("***" if k in SECRET_OPTIONS and v else v) for k, v in options.items()}
