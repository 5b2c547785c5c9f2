"""Keep secrets out of every log line, repr and exception message the library writes."""

from __future__ import annotations

import re

__all__ = ["redact"]

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
