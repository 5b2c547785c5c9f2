"""The local replica's pure helpers: Native blocks for a protocol revision, request text, users, compression."""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest
from clickhouse_connect.driver.summary import QuerySummary

from clickhouse_lb.testing import User, _encoding, _native
from clickhouse_lb.testing._engine import ClickHouseError, Summary
from clickhouse_lb.testing._request import (
    decode_sql,
    escape_undecodable,
    external_table,
    late_exception,
    split_top_level,
)
from clickhouse_lb.testing._users import users_from_json, users_to_json


def _string(text: str) -> bytes:
    data = text.encode()
    return _native.write_varint(len(data)) + data


def _block(rows: int, columns: list[tuple[str, str, bytes]]) -> bytes:
    out = _native.write_varint(len(columns)) + _native.write_varint(rows)
    for name, type_name, data in columns:
        out += _string(name) + _string(type_name) + data
    return out


STRINGS = b"".join(_string(s) for s in ("a", "bb"))
ARRAYS = (1).to_bytes(8, "little") + (3).to_bytes(8, "little") + bytes(3 * 8)  # offsets 1, 3; 3 UInt64
LC = (
    (1).to_bytes(8, "little")  # key version (prefix)
    + (0x200).to_bytes(8, "little")  # index type UInt8 + has additional keys
    + (2).to_bytes(8, "little")
    + _string("x")
    + _string("y")
    + (2).to_bytes(8, "little")
    + bytes([0, 1])
)
BLOCK = _block(
    2,
    [
        ("s", "String", STRINGS),
        ("a", "Array(UInt64)", ARRAYS),
        ("n", "Nullable(Int32)", bytes(2) + bytes(8)),
        ("lc", "LowCardinality(String)", LC),
        ("t", "Tuple(x UInt8, y String)", bytes(2) + STRINGS),
        ("d", "DateTime", bytes(8)),
    ],
)


def test_native_blocks_are_walked_and_split() -> None:
    assert _native.block_end(BLOCK) == len(BLOCK)
    assert _native.split_blocks(BLOCK + BLOCK) == [BLOCK, BLOCK]
    assert _native.column_types(BLOCK)[-1] == "DateTime"
    assert _native.split_blocks(_block(1, [("v", "Variant(String, UInt8)", b"\x00")])) is None


def test_native_for_revision() -> None:
    assert _native.for_revision(BLOCK, 0) == BLOCK
    assert _native.for_revision(BLOCK, 54405) == _native.BLOCK_INFO + BLOCK
    zoned: list[str | None] = [None] * 5 + ["DateTime('Asia/Tokyo')"]
    shaped = _native.for_revision(BLOCK, 54405, zoned)
    assert shaped.startswith(_native.BLOCK_INFO)
    assert shaped[len(_native.BLOCK_INFO) :] == BLOCK.replace(_string("DateTime"), _string("DateTime('Asia/Tokyo')"))
    assert _native.for_revision(BLOCK, 54336, zoned) == _native.BLOCK_INFO + BLOCK  # before zones existed


def test_binary_text_for_the_engine() -> None:
    assert decode_sql("SELECT 'é'".encode()) == "SELECT 'é'"
    assert decode_sql(b"SELECT '\xff\x00'") == "SELECT '\\xFF\x00'"
    assert escape_undecodable(b"a\x80b".decode("utf-8", "surrogateescape")) == "a\\x80b"
    # a heredoc takes no escapes: one with binary content becomes a quoted literal
    assert decode_sql(b"SELECT $p$\xff'\\$p$, $q$ok$q$") == "SELECT '\\xFF\\'\\\\', $q$ok$q$"


def test_external_table_structure() -> None:
    params = {"t_types": "UInt8, Decimal(10, 2),Tuple(a String, b UInt8)", "t_format": "CSV", "other": "1"}
    table = external_table("t", b"1,2,3\n", params)
    assert table.structure == "_1 UInt8, _2 Decimal(10, 2), _3 Tuple(a String, b UInt8)"
    assert table.fmt == "CSV"
    assert params == {"other": "1"}  # a table's own parameters are not settings
    assert external_table("u", b"", {"u_structure": "id UInt8"}).fmt == "TabSeparated"
    with pytest.raises(ClickHouseError) as info:
        external_table("v", b"", {})
    assert info.value.code == 36
    assert split_top_level("a, 'x,y', f(1, 2)") == ["a", "'x,y'", "f(1, 2)"]


def test_late_exception_is_what_clickhouse_connect_extracts() -> None:
    from clickhouse_connect.driver.transform import extract_exception_with_tag

    block = late_exception("abcdefgh12345678", "Code: 395. DB::Exception: boom. (X) (version 1)\n")
    assert block.startswith(b"__exception__\r\nabcdefgh12345678\r\n")
    message = extract_exception_with_tag(b"rows\n" + block, "abcdefgh12345678")
    assert message == "Code: 395. DB::Exception: boom. (X) (version 1)"


def test_users_round_trip_and_validation() -> None:
    users = {"alice": User("pw"), "reader": User("r", readonly=1)}
    assert users_from_json(users_to_json(users)) == users
    with pytest.raises(ValueError, match="readonly must be 0, 1 or 2, not 5"):
        User("x", readonly=5)


@pytest.mark.parametrize("method", ["gzip", "deflate", "zstd", "lz4"])
def test_stream_compressor_pieces_decode_on_arrival(method: str) -> None:
    compressor = _encoding.StreamCompressor(method)
    first = compressor.chunk(b"first piece\n")
    rest = compressor.chunk(b"second\n") + compressor.end()
    assert _encoding.decompress(first + rest, method) == b"first piece\nsecond\n"
    if method in ("gzip", "deflate"):  # flushed: the first piece decodes before the stream ends
        import zlib

        partial = zlib.decompressobj(31 if method == "gzip" else 15).decompress(first)
        assert partial == b"first piece\n"


def test_summary_header_is_what_clickhouse_connect_reads() -> None:
    """LocalCluster's X-ClickHouse-Summary: every count a string, as the server sends them, so
    that ``client.insert(...).written_rows`` and ``summary.as_query_result()`` work as on a server."""
    summary = QuerySummary(json.loads(Summary(1, 2, 3, 4, elapsed=0.25).header()))
    assert summary.written_rows == 3
    assert summary.written_bytes() == 4
    assert summary.summary == {
        "read_rows": "1", "read_bytes": "2", "written_rows": "3", "written_bytes": "4", "elapsed_ns": "250000000",
    }
    assert list(summary.as_query_result().first_row) == [1, 2, 3, 4, 250000000]


def test_the_gil_holder_resizes_its_holds_towards_the_target() -> None:
    """A hold that took twice the target shrinks the next sort, one that took half grows it, each
    by a damped step (a size measured once on a quiet machine held the GIL 1.2-2.4 s for a
    0.8 s target once the machine got busy)."""
    from clickhouse_lb.testing.load import GilHolder

    holder = GilHolder.__new__(GilHolder)
    holder.target = 0.8
    holder._size = 1_000_000
    assert holder._scaled(1.6) == 670_000
    assert holder._scaled(0.4) == 1_500_000
    assert holder._scaled(0.8) == 1_000_000
    assert holder._scaled(100.0) == 670_000  # damped: one burst of load does not collapse it


def test_an_exact_gil_holder_holds_the_gil_for_its_whole_target() -> None:
    """``exact=True``: every hold is the target, and no other thread of the process runs during
    it (a ``usleep`` that released the GIL would let the ticker below run every millisecond)."""
    from clickhouse_lb.testing.load import GilHolder

    ticks: list[float] = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    thread = threading.Thread(target=ticker)
    thread.start()
    holder = GilHolder(0.3, pause=0.05, exact=True)
    with holder.running():
        holder.holds.first.wait()
    stop.set()
    thread.join()
    assert holder.holds
    assert min(holder.holds) >= 0.3
    longest_tick_gap = max(b - a for a, b in itertools.pairwise(ticks))
    assert longest_tick_gap >= 0.27, f"the ticker ran during the hold (longest gap {longest_tick_gap:.3f}s)"
