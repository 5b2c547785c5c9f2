"""HTTP body compression for the local replica (``Content-Encoding`` / ``Accept-Encoding``).

ClickHouse compresses a response only when the request sets ``enable_http_compression=1``,
choosing a method the client lists in ``Accept-Encoding``; it always decompresses a request
body according to ``Content-Encoding``. The methods here are the ones clickhouse-connect
speaks: ``gzip``, ``deflate`` (zlib stream), ``zstd`` (zstd frame), ``lz4`` (lz4 *frame*, as
clickhouse-connect encodes and decodes it) and ``br`` when the ``brotli`` module is importable.
ClickHouse also knows ``xz``, ``bz2`` and ``snappy``; those are not offered here (the response
is then sent uncompressed, which every client accepts).
"""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import lz4.frame
import zstandard

try:  # optional, like in clickhouse-connect
    import brotli as _brotli  # type: ignore[import-not-found, unused-ignore]

    _BROTLI: Any = _brotli
except ImportError:  # pragma: no cover - depends on the environment
    _BROTLI = None

#: Methods this replica can produce, in no particular order.
SUPPORTED: frozenset[str] = frozenset({"gzip", "deflate", "zstd", "lz4"} | ({"br"} if _BROTLI else set()))


class UnsupportedEncoding(ValueError):
    """A request body uses a Content-Encoding this replica cannot decode."""


def choose(accept_encoding: str | None) -> str | None:
    """Pick the response encoding: the first method listed by the client that we support."""
    if not accept_encoding:
        return None
    for item in accept_encoding.split(","):
        token = item.split(";", 1)[0].strip().lower()
        if token == "x-gzip":
            token = "gzip"
        if token in SUPPORTED:
            return token
    return None


def compress(data: bytes, method: str, level: int | None = None) -> bytes:
    """Compress a whole response body with ``method`` (one of :data:`SUPPORTED`)."""
    if method == "gzip":
        return gzip.compress(data, compresslevel=level if level is not None else 3, mtime=0)
    if method == "deflate":
        return zlib.compress(data, level if level is not None else 3)
    if method == "zstd":
        return zstandard.ZstdCompressor(level=1).compress(data)
    if method == "lz4":
        return bytes(lz4.frame.compress(data))
    if method == "br" and _BROTLI is not None:
        return bytes(_BROTLI.compress(data, quality=1))
    raise UnsupportedEncoding(method)


def decompress(data: bytes, content_encoding: str | None) -> bytes:
    """Decode a request body according to its ``Content-Encoding`` header."""
    method = (content_encoding or "").strip().lower()
    if not method or method == "identity" or not data:
        return data
    if method in ("gzip", "x-gzip"):
        return gzip.decompress(data)
    if method == "deflate":
        try:
            return zlib.decompress(data)
        except zlib.error:  # raw deflate without the zlib header, as some clients send it
            return zlib.decompress(data, -zlib.MAX_WBITS)
    if method == "zstd":
        return _zstd_frames(data)
    if method == "lz4":
        return _lz4_frames(data)
    if method == "br" and _BROTLI is not None:
        return bytes(_BROTLI.decompress(data))
    raise UnsupportedEncoding(method)


def _zstd_frames(data: bytes) -> bytes:
    """Decode one or more concatenated zstd frames (clickhouse-connect sends a frame per block)."""
    parts: list[bytes] = []
    rest = data
    while rest:
        obj = zstandard.ZstdDecompressor().decompressobj()
        parts.append(obj.decompress(rest))
        rest = obj.unused_data
    return b"".join(parts)


def _lz4_frames(data: bytes) -> bytes:
    """Decode one or more concatenated lz4 frames."""
    parts: list[bytes] = []
    rest = data
    while rest:
        obj = lz4.frame.LZ4FrameDecompressor()
        parts.append(bytes(obj.decompress(rest)))
        if not obj.eof:
            raise UnsupportedEncoding("truncated lz4 frame")
        rest = bytes(obj.unused_data or b"")
    return b"".join(parts)


class StreamCompressor:
    """Compresses a response that is sent in pieces: each :meth:`chunk` is flushed so the client
    can decode it on arrival; :meth:`end` closes the stream (one gzip/zstd/lz4 frame in all)."""

    def __init__(self, method: str, level: int | None = None) -> None:
        self.method = method
        self._obj: Any
        if method in ("gzip", "deflate"):
            wbits = 31 if method == "gzip" else 15
            self._obj = zlib.compressobj(level if level is not None else 3, zlib.DEFLATED, wbits)
        elif method == "zstd":
            self._obj = zstandard.ZstdCompressor(level=1).compressobj()
        elif method == "lz4":
            self._obj = lz4.frame.LZ4FrameCompressor(auto_flush=True)
            self._head = bytes(self._obj.begin())
        elif method == "br" and _BROTLI is not None:
            self._obj = _BROTLI.Compressor(quality=1)
        else:
            raise UnsupportedEncoding(method)

    def chunk(self, data: bytes) -> bytes:
        """Compress ``data`` and flush, so everything given so far can be decoded."""
        if self.method in ("gzip", "deflate"):
            return bytes(self._obj.compress(data) + self._obj.flush(zlib.Z_SYNC_FLUSH))
        if self.method == "zstd":
            return bytes(self._obj.compress(data) + self._obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
        if self.method == "lz4":
            head, self._head = self._head, b""
            return head + bytes(self._obj.compress(data))
        return bytes(self._obj.process(data) + self._obj.flush())

    def end(self) -> bytes:
        """The bytes that close the compressed stream."""
        if self.method == "lz4":
            head, self._head = self._head, b""
            return head + bytes(self._obj.flush())
        if self.method == "br":
            return bytes(self._obj.finish())
        return bytes(self._obj.flush())
