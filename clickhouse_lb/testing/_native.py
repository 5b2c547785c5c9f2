"""ClickHouse's Native format as a client with ``client_protocol_version`` expects it.

The engine (chdb) writes Native output as for a client of protocol revision 0: no block info in
front of each block, and a top-level ``DateTime('Zone')`` column announced as plain ``DateTime``
(ClickHouse drops the zone for clients older than revision 54337). A client that sent
``client_protocol_version`` (clickhouse-connect sends 54405 once its probe succeeds) expects both.
:func:`for_revision` turns one engine block into that form: the block info is prepended and the
zones of top-level DateTime columns are written back, from the column types the caller got
with ``DESCRIBE``.

Walking a block to reach a column header needs the byte size of the columns before it; the
types for which that size is computed here are the common ones (numbers, strings, dates,
Nullable, Array, Tuple, Map, LowCardinality, ...). A DateTime column that comes after a column
of another type (Variant, Dynamic, JSON, AggregateFunction) keeps the plain ``DateTime`` name.
Pure functions: no I/O.
"""

from __future__ import annotations

import re

from clickhouse_lb.testing._request import split_top_level

#: Revision from which a Native block starts with its BlockInfo (DBMS_MIN_REVISION_WITH_BLOCK_INFO).
REVISION_WITH_BLOCK_INFO = 51903
#: Revision from which DateTime keeps its time zone parameter in Native output.
REVISION_WITH_DATETIME_ZONE = 54337
#: Revision from which columns carry a serialization-kind byte (sparse columns); not produced here.
REVISION_WITH_CUSTOM_SERIALIZATION = 54454
#: BlockInfo: field 1 is_overflows = false, field 2 bucket_num = -1, field 0 = end.
BLOCK_INFO = b"\x01\x00\x02\xff\xff\xff\xff\x00"

_FIXED: dict[str, int] = {
    "Int8": 1,
    "UInt8": 1,
    "Bool": 1,
    "Enum8": 1,
    "Int16": 2,
    "UInt16": 2,
    "Enum16": 2,
    "Date": 2,
    "BFloat16": 2,
    "Int32": 4,
    "UInt32": 4,
    "Float32": 4,
    "Date32": 4,
    "DateTime": 4,
    "IPv4": 4,
    "Decimal32": 4,
    "Time": 4,
    "Int64": 8,
    "UInt64": 8,
    "Float64": 8,
    "DateTime64": 8,
    "Decimal64": 8,
    "Time64": 8,
    "Int128": 16,
    "UInt128": 16,
    "UUID": 16,
    "IPv6": 16,
    "Decimal128": 16,
    "Int256": 32,
    "UInt256": 32,
    "Decimal256": 32,
}


class Unsupported(ValueError):
    """A type whose serialized size this module does not compute."""


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """LEB128 unsigned integer at ``pos``: (value, position after it)."""
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def write_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_NAMED_ELEMENT = re.compile(r"^(?:`[^`]*`|[A-Za-z_][A-Za-z0-9_]*)\s+(?=[A-Z])")


def _parse(type_name: str) -> tuple[str, list[str]]:
    """``Array(Nullable(String))`` -> ("Array", ["Nullable(String)"])."""
    base, paren, rest = type_name.partition("(")
    if not paren:
        return type_name.strip(), []
    return base.strip(), split_top_level(rest[: rest.rfind(")")])


def _decimal_size(args: list[str]) -> int:
    precision = int(args[0])
    return 4 if precision <= 9 else 8 if precision <= 18 else 16 if precision <= 38 else 32


def _prefix_size(type_name: str, buf: bytes, pos: int) -> int:
    """Skip the per-column serialization prefix a type writes before its data (LowCardinality's
    key version, also inside Array/Tuple/Map/Nullable)."""
    base, args = _parse(type_name)
    if base == "LowCardinality":
        return pos + 8
    if base in ("Array", "Nullable"):
        return _prefix_size(args[0], buf, pos)
    if base == "Map":
        return _prefix_size(args[1], buf, _prefix_size(args[0], buf, pos))
    if base == "Tuple":
        for arg in args:
            pos = _prefix_size(_NAMED_ELEMENT.sub("", arg), buf, pos)
    return pos


def _skip_data(type_name: str, rows: int, buf: bytes, pos: int) -> int:
    base, args = _parse(type_name)
    if base in _FIXED:
        return pos + _FIXED[base] * rows
    if base == "Decimal":
        return pos + _decimal_size(args) * rows
    if base == "FixedString":
        return pos + int(args[0]) * rows
    if base == "String":
        for _ in range(rows):
            length, pos = read_varint(buf, pos)
            pos += length
        return pos
    if base == "Nullable":
        return _skip_data(args[0], rows, buf, pos + rows)
    if base in ("Array", "Map"):
        total = int.from_bytes(buf[pos + 8 * (rows - 1) : pos + 8 * rows], "little") if rows else 0
        pos += 8 * rows
        if base == "Array":
            return _skip_data(args[0], total, buf, pos)
        return _skip_data(args[1], total, buf, _skip_data(args[0], total, buf, pos))
    if base == "Tuple":
        for arg in args:
            pos = _skip_data(_NAMED_ELEMENT.sub("", arg), rows, buf, pos)
        return pos
    if base == "LowCardinality":
        if rows == 0:
            return pos
        flags = int.from_bytes(buf[pos : pos + 8], "little")
        pos += 8
        keys = int.from_bytes(buf[pos : pos + 8], "little")
        pos += 8
        inner_base, inner_args = _parse(args[0])
        dictionary_type = inner_args[0] if inner_base == "Nullable" else args[0]  # the dictionary is not Nullable
        pos = _skip_data(dictionary_type, keys, buf, pos)
        indexes = int.from_bytes(buf[pos : pos + 8], "little")
        pos += 8
        return pos + (1 << (flags & 0xFF)) * indexes
    if base == "Nothing":
        return pos + rows
    raise Unsupported(type_name)


def column_types(block: bytes) -> list[str]:
    """The column types named in the header of a revision-0 Native block (no data walked past
    the first column's header when there are no rows; types only, in order)."""
    columns, pos = read_varint(block, 0)
    rows, pos = read_varint(block, pos)
    types: list[str] = []
    for _ in range(columns):
        length, pos = read_varint(block, pos)
        pos += length
        length, pos = read_varint(block, pos)
        types.append(block[pos : pos + length].decode())
        pos += length
        if rows:
            try:
                pos = _skip_data(types[-1], rows, block, _prefix_size(types[-1], block, pos))
            except (Unsupported, IndexError, ValueError):
                break  # the rest cannot be reached
    return types


def for_revision(block: bytes, revision: int, zoned: list[str | None] | None = None) -> bytes:
    """One revision-0 Native block (as the engine writes it) as a client of ``revision`` reads it.

    ``zoned``: for each column, the full type to announce instead of a plain ``DateTime`` (from
    DESCRIBE), or None; only used from :data:`REVISION_WITH_DATETIME_ZONE` on.
    """
    if revision < REVISION_WITH_BLOCK_INFO or not block:
        return block
    if revision < REVISION_WITH_DATETIME_ZONE or not zoned or not any(zoned):
        return BLOCK_INFO + block
    columns, pos = read_varint(block, 0)
    rows, pos = read_varint(block, pos)
    out = [BLOCK_INFO, block[:pos]]
    copied = pos
    try:
        for i in range(min(columns, len(zoned))):
            length, pos = read_varint(block, pos)
            pos += length
            type_start = pos
            length, pos = read_varint(block, pos)
            type_name = block[pos : pos + length].decode()
            pos += length
            real = zoned[i]
            if type_name == "DateTime" and real and real.startswith("DateTime("):
                out += [block[copied:type_start], write_varint(len(real.encode())), real.encode()]
                copied = pos
            if i + 1 < len(zoned) and any(zoned[i + 1 :]) and rows:
                pos = _skip_data(type_name, rows, block, _prefix_size(type_name, block, pos))
            elif not any(zoned[i + 1 :]):
                break
    except (Unsupported, IndexError, ValueError):
        pass  # columns after an unknown type keep the engine's names
    out.append(block[copied:])
    return b"".join(out)


def block_end(data: bytes, start: int = 0) -> int | None:
    """Where the revision-0 Native block starting at ``start`` ends, or None if it cannot be walked."""
    try:
        columns, pos = read_varint(data, start)
        rows, pos = read_varint(data, pos)
        for _ in range(columns):
            length, pos = read_varint(data, pos)
            pos += length
            length, pos = read_varint(data, pos)
            type_name = data[pos : pos + length].decode()
            pos += length
            if rows:
                pos = _skip_data(type_name, rows, data, _prefix_size(type_name, data, pos))
    except (Unsupported, IndexError, ValueError):
        return None
    return pos if pos <= len(data) else None


def split_blocks(data: bytes) -> list[bytes] | None:
    """A revision-0 Native result cut into its blocks, or None if a block cannot be walked."""
    blocks: list[bytes] = []
    start = 0
    while start < len(data):
        end = block_end(data, start)
        if end is None or end == start:
            return None
        blocks.append(data[start:end])
        start = end
    return blocks
