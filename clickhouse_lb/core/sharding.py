"""Which shard a row goes to, exactly as a ClickHouse ``Distributed`` table decides it. No I/O.

The rule, read from ClickHouse's source:

- **Slots** (``Cluster.cpp``, where ``slot_to_shard`` is filled): every shard, in the cluster's
  order, gets as many slots as its weight (a shard of weight 0 gets none and receives no rows).
- **Selector** (``Interpreters/createBlockSelector.cpp``): the sharding expression must have an
  integer type; its value ``v`` picks ``slots[u % len(slots)]``, where ``u`` is ``v`` converted
  to ``UInt32`` when the type is 32 bits or narrower and to ``UInt64`` otherwise (so a negative
  ``Int8``/``Int16``/``Int32`` value is taken modulo 2**32, an ``Int64`` modulo 2**64).
- **Hash functions** (``Functions/FunctionsHashing.h``), as checked against the engine itself
  (tests/test_sharding.py asks chdb for the same values): ``intHash64(x)`` mixes ``x``
  converted to UInt64 (sign-extended) and XORed with a constant; ``cityHash64`` of an integer is ``intHash64`` of the
  value's bit pattern zero-extended from its width, of a string CityHash64 v1.0.2 of its bytes;
  ``sipHash64`` is SipHash-2-4 (key 0) of the value's little-endian bytes (a string's bytes).
  A ``FixedString(N)`` value is stored padded with zero bytes to N, and all N bytes are hashed.
  ``rand()`` is a random UInt32.

Vectorised with NumPy for integer keys; strings go through the C implementations of the
``sharding`` extra (``clickhouse-cityhash``, ``siphash24``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from clickhouse_lb.errors import ConfigurationError

__all__ = [
    "KEY_FUNCTIONS",
    "FixedStringType",
    "IntegerType",
    "ShardingKey",
    "dtype_kind",
    "key_values",
    "parse_sharding_key",
    "part_token",
    "route",
    "shard_indices",
    "slot_table",
    "value_type",
]

#: The sharding expressions routed on the client: ``col``, ``f(col)`` for these, and ``rand()``.
KEY_FUNCTIONS = ("cityHash64", "sipHash64", "intHash64", "rand")

_KEY_FORMS = "a column (`id`), cityHash64(col), sipHash64(col), intHash64(col) or rand()"
_IDENT = r"`[^`]+`|[A-Za-z_][A-Za-z0-9_]*"
_KEY = re.compile(rf"^\s*(?:(?P<fn>[A-Za-z0-9_]+)\s*\(\s*(?P<arg>{_IDENT})?\s*\)|(?P<col>{_IDENT}))\s*$")

_U64 = np.uint64
_MASK32 = (1 << 32) - 1
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class ShardingKey:
    """A parsed sharding expression: ``function`` (None: the column's own value) of ``column``
    (None for ``rand()``)."""

    text: str
    function: str | None
    column: str | None


def parse_sharding_key(text: str) -> ShardingKey:
    """``"cityHash64(user_id)"`` -> ShardingKey; anything else is refused naming the forms."""
    match = _KEY.match(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigurationError(f"Bad sharding_key {text!r}: expected {_KEY_FORMS}")
    if match["col"] is not None:
        return ShardingKey(text, None, match["col"].strip("`"))
    function, column = match["fn"], match["arg"]
    if function not in KEY_FUNCTIONS:
        raise ConfigurationError(
            f"Bad sharding_key {text!r}: {function}() is not routed on the client; expected {_KEY_FORMS}"
        )
    if (function == "rand") != (column is None):
        raise ConfigurationError(f"Bad sharding_key {text!r}: expected {_KEY_FORMS}")
    return ShardingKey(text, function, column.strip("`") if column else None)


@dataclass(frozen=True)
class IntegerType:
    bits: int
    signed: bool


@dataclass(frozen=True)
class FixedStringType:
    """``FixedString(length)``: its values are hashed padded with zero bytes to ``length``."""

    length: int


_INTEGER = re.compile(r"^(U?)Int(8|16|32|64)$")
_FIXED_STRING = re.compile(r"^FixedString\(\s*(\d+)\s*\)$")
_WRAPPER = re.compile(r"^(?:Nullable|LowCardinality)\((.*)\)$")
STRING = "string"

#: What :func:`value_type` makes of a key column's type.
KeyKind = IntegerType | FixedStringType | str


def value_type(type_name: str) -> KeyKind:
    """The key column's ClickHouse type -> an :class:`IntegerType`, a :class:`FixedStringType`
    or ``STRING``; other types are refused (a Distributed table refuses a non-integer sharding
    expression too)."""
    name = type_name.strip()
    while (wrapped := _WRAPPER.match(name)) is not None:
        name = wrapped.group(1).strip()
    if name == "Bool":
        return IntegerType(8, False)
    integer = _INTEGER.match(name)
    if integer is not None:
        return IntegerType(int(integer.group(2)), integer.group(1) == "")
    if name == "String":
        return STRING
    fixed = _FIXED_STRING.match(name)
    if fixed is not None:
        return FixedStringType(int(fixed.group(1)))
    raise ConfigurationError(
        f"Cannot route rows by a {type_name} column: the sharding key's column must be an integer "
        "(UInt8..UInt64, Int8..Int64) or, inside a hash function, a String or FixedString"
    )


def dtype_kind(values: Any) -> IntegerType | None:
    """The integer type a NumPy array's own dtype suggests for its column (None: not an integer
    array). A guess: the table's column may be of another type, which alone decides the hash."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return IntegerType(values.dtype.itemsize * 8, values.dtype.kind == "i")
    return None


def slot_table(weights: Sequence[int]) -> tuple[int, ...]:
    """Shard positions, each repeated by its weight (``Cluster``'s ``slot_to_shard``)."""
    for weight in weights:
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
            raise ConfigurationError(f"Bad shard weight {weight!r}: expected an integer >= 0")
    slots = tuple(shard for shard, weight in enumerate(weights) for _ in range(weight))
    if not slots:
        raise ConfigurationError(f"Bad shard weights {list(weights)!r}: at least one shard needs a weight > 0")
    return slots


def shard_indices(selector_values: np.ndarray, slots: Sequence[int]) -> np.ndarray:
    """Each row's shard position (int64) from the selector's unsigned key values."""
    positions: np.ndarray = _positions(selector_values, slots).astype(np.int64, copy=False)
    return positions


def _positions(selector_values: np.ndarray, slots: Sequence[int]) -> np.ndarray:
    """:func:`shard_indices`, in whichever integer dtype comes cheapest (no copy to int64)."""
    size = len(slots)
    if (size & (size - 1) == 0 and size <= 256 and sys.byteorder == "little" and selector_values.dtype == _U64
            and selector_values.flags.c_contiguous):
        # A power of two up to 256 slots needs only the low byte: read it in place (a strided
        # view) into 1 MB for a million rows, not a fresh 8 MB uint64 array.
        slot: np.ndarray = selector_values.view(np.uint8)[::8] & np.uint8(size - 1)
    elif size & (size - 1) == 0:  # same result as ``%``, cheaper
        slot = selector_values & _U64(size - 1)
    else:
        slot = selector_values % _U64(size)
    if tuple(slots) == tuple(range(size)):
        return slot
    positions: np.ndarray = np.asarray(slots, dtype=np.int64)[slot]
    return positions


def _as_uint64(values: Sequence[Any] | np.ndarray, mask: int) -> np.ndarray:
    """Integers -> their two's-complement bit patterns under ``mask``, as uint64. A NumPy integer
    array is converted in one step (sign-extended to 64 bits, then viewed unsigned: the same bit
    pattern for every integer dtype); other sequences in C, as Int64 when they fit, else as UInt64."""
    try:
        if isinstance(values, np.ndarray) and values.dtype.kind in "iub":
            patterns = values.astype(np.int64, copy=False).view(_U64)
        elif isinstance(values, np.ndarray) and values.dtype.kind != "O":
            # Floats (a pandas integer column with missing values), dates, ...: not truncated.
            raise TypeError(f"an array of {values.dtype}")
        else:
            try:
                patterns = np.asarray(values, dtype=np.int64).view(_U64)
            except OverflowError:  # UInt64 values of 2**63 and over
                patterns = np.asarray(values, dtype=_U64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigurationError(f"Bad sharding key value: expected integers of the column's type ({exc})") from None
    if patterns.ndim != 1:
        raise ConfigurationError("Bad sharding key values: expected one integer per row")
    masked: np.ndarray = patterns if mask == _MASK64 else patterns & _U64(mask)
    return masked


#: ``IntHash64Impl`` mixes the value XOR this constant (so that intHash64(0) is not 0).
_INT_HASH64_SALT = _U64(0x4CF2D2BAAE6DA887)


#: Values hashed at a time by :func:`_mix64`: its two 256 KB blocks stay in the CPU's cache
#: through the hash's nine passes (1M values: 2.1-2.3 ms against 3.3-4.2 ms over the whole
#: arrays, medians of 40, load 3.8; 8k and 128k were no faster).
_MIX_BLOCK = 1 << 15


def _mix64(x: np.ndarray) -> np.ndarray:
    """The SQL function ``intHash64``: MurmurHash3's 64-bit finaliser of ``x ^ salt`` (wraps
    modulo 2**64), into a new array, block by block, in place within each block."""
    out = np.empty(len(x), dtype=_U64)
    shifted = np.empty(min(len(x), _MIX_BLOCK), dtype=_U64)
    for start in range(0, len(x), _MIX_BLOCK):
        block = out[start:start + _MIX_BLOCK]
        carry = shifted[:len(block)]
        np.bitwise_xor(x[start:start + _MIX_BLOCK], _INT_HASH64_SALT, out=block)
        np.right_shift(block, _U64(33), out=carry)
        block ^= carry
        block *= _U64(0xFF51AFD7ED558CCD)
        np.right_shift(block, _U64(33), out=carry)
        block ^= carry
        block *= _U64(0xC4CEB9FE1A85EC53)
        np.right_shift(block, _U64(33), out=carry)
        block ^= carry
    return out


def _rotl(x: np.ndarray, bits: int) -> np.ndarray:
    rotated: np.ndarray = (x << _U64(bits)) | (x >> _U64(64 - bits))
    return rotated


def _sip_round(v0: np.ndarray, v1: np.ndarray, v2: np.ndarray, v3: np.ndarray) -> tuple[np.ndarray, ...]:
    v0 = v0 + v1
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = v2 + v3
    v3 = _rotl(v3, 16) ^ v2
    v0 = v0 + v3
    v3 = _rotl(v3, 21) ^ v0
    v2 = v2 + v1
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def _siphash_fixed(words: np.ndarray, width: int) -> np.ndarray:
    """SipHash-2-4 with the zero key of messages of ``width`` bytes (1, 2, 4 or 8), each given
    as its little-endian value in ``words``: at most one full block, then the length block."""
    n = len(words)
    v0 = np.full(n, 0x736F6D6570736575, dtype=_U64)
    v1 = np.full(n, 0x646F72616E646F6D, dtype=_U64)
    v2 = np.full(n, 0x6C7967656E657261, dtype=_U64)
    v3 = np.full(n, 0x7465646279746573, dtype=_U64)
    blocks = [words, np.full(n, width << 56, dtype=_U64)] if width == 8 else [words | _U64(width << 56)]
    for block in blocks:
        v3 = v3 ^ block
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
        v0 = v0 ^ block
    v2 = v2 ^ _U64(0xFF)
    for _ in range(4):
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def _string_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise ConfigurationError(f"Bad sharding key value {value!r}: expected a str or bytes for a String column")


def _padded(values: Sequence[Any] | np.ndarray, length: int) -> list[bytes]:
    """``FixedString(length)`` values as the server stores them: padded with zero bytes to
    ``length`` (a NumPy ``S`` array has even dropped the trailing zeros a value had). A longer
    value is refused, as the server refuses it ("Too large value for FixedString")."""
    encoded = [_string_bytes(v) for v in values]
    longest = max(encoded, key=len, default=b"")
    if len(longest) > length:
        value = values[encoded.index(longest)]
        raise ConfigurationError(
            f"Bad sharding key value {value!r}: {len(longest)} bytes, longer than its FixedString({length}) "
            f"column allows ({length} bytes at most)"
        )
    # ljust pads with the zero byte in C; a value already of the length is returned as is.
    return list(map(bytes.ljust, encoded, repeat(length), repeat(b"\0")))


def _hash_strings(function: str, values: Sequence[Any] | np.ndarray, fixed: int | None = None) -> np.ndarray:
    try:
        if function == "cityHash64":
            from clickhouse_cityhash.cityhash import CityHash64 as digest
        else:
            from siphash24 import siphash24

            def digest(data: bytes) -> int:
                return int(siphash24(data).intdigest()) & _MASK64
    except ImportError:
        raise ConfigurationError(
            f"Routing by {function}() of a string needs the sharding extra: pip install 'clickhouse-lb[sharding]'"
        ) from None
    count = len(values)
    if fixed is not None:
        return np.fromiter(map(digest, _padded(values, fixed)), dtype=_U64, count=count)
    try:  # all str, the usual case: encoded in C, no Python call per row but the hash's
        return np.fromiter(map(digest, map(str.encode, values)), dtype=_U64, count=count)
    except TypeError:  # bytes among them (or a bad value: _string_bytes names it)
        return np.fromiter((digest(_string_bytes(v)) for v in values), dtype=_U64, count=count)


def key_values(
    key: ShardingKey, values: Sequence[Any] | np.ndarray | None, kind: KeyKind | None, rows: int
) -> np.ndarray:
    """The selector's unsigned input for each row: the sharding expression's value for the
    key column's ``values`` (of ``kind``, see :func:`value_type`), converted as the selector
    converts it. ``rand()`` takes no values (``rows`` of them are drawn)."""
    if key.function == "rand":
        return np.random.default_rng().integers(0, 1 << 32, size=rows, dtype=_U64)
    assert values is not None
    assert kind is not None
    if kind == STRING or isinstance(kind, FixedStringType):
        if key.function in (None, "intHash64"):  # the server refuses intHash64 of a string too
            raise ConfigurationError(
                f"Bad sharding_key {key.text!r}: a String or FixedString column needs a string hash, "
                f"cityHash64({key.column}) or sipHash64({key.column})"
            )
        return _hash_strings(key.function, values, kind.length if isinstance(kind, FixedStringType) else None)
    assert isinstance(kind, IntegerType)
    if key.function is None:  # the value itself, as the selector converts it
        return _as_uint64(values, _MASK32 if kind.bits <= 32 else _MASK64)
    if key.function == "intHash64":
        return _mix64(_as_uint64(values, _MASK64))
    pattern = _as_uint64(values, (1 << kind.bits) - 1)
    if key.function == "cityHash64":
        return _mix64(pattern)
    return _siphash_fixed(pattern, kind.bits // 8)


def route(
    key: ShardingKey, values: Sequence[Any] | np.ndarray | None, kind: KeyKind | None, rows: int,
    *, slots: Sequence[int], shards: int,
) -> list[np.ndarray]:
    """The row indices (ascending, as an int64 array) of each shard position; a shard with no
    rows gets an empty array."""
    positions = _positions(key_values(key, values, kind, rows), slots)
    if shards == 1:
        return [np.arange(rows)]
    if shards == 2:  # one comparison, and its complement
        second = positions != 0
        return [np.flatnonzero(~second), np.flatnonzero(second)]
    # One pass per shard beats sorting for the few shards a cluster has.
    return [np.flatnonzero(positions == shard) for shard in range(shards)]


def part_token(token: object, shard_num: int) -> str | None:
    """A part's deduplication token from the insert's own (None: each part gets a fresh one
    from its shard's pool). Derived, so that repeating the insert repeats every part's token."""
    return None if token is None else f"{token}:shard-{shard_num}"
