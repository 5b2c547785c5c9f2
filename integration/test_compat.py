"""clickhouse-connect against one replica of the test cluster: types, formats, params, errors, compression."""

from __future__ import annotations

import datetime as dt
import decimal
import ipaddress
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from clickhouse_lb.classify import error_code
from clickhouse_lb.testing import ClusterBase

pytestmark = pytest.mark.integration

COLUMNS = [
    ("i8", "Int8", -8),
    ("i16", "Int16", -1600),
    ("i32", "Int32", -320000),
    ("i64", "Int64", -(2**62)),
    ("i128", "Int128", -(2**100)),
    ("i256", "Int256", 2**200),
    ("u8", "UInt8", 255),
    ("u16", "UInt16", 65535),
    ("u32", "UInt32", 2**32 - 1),
    ("u64", "UInt64", 2**64 - 1),
    ("u128", "UInt128", 2**127),
    ("u256", "UInt256", 2**255),
    ("f32", "Float32", 1.5),
    ("f64", "Float64", 2.25),
    ("dec", "Decimal(18, 4)", decimal.Decimal("12345.6789")),
    ("s", "String", "héllo"),
    ("fs", "FixedString(3)", b"abc"),
    ("d", "Date", dt.date(2024, 2, 29)),
    ("d32", "Date32", dt.date(1950, 1, 2)),
    ("dt", "DateTime", dt.datetime(2024, 5, 6, 7, 8, 9)),
    (
        "dt64",
        "DateTime64(3, 'Europe/Paris')",
        dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=ZoneInfo("Europe/Paris")),
    ),
    ("uid", "UUID", uuid.UUID("12345678-1234-5678-1234-567812345678")),
    ("ip4", "IPv4", ipaddress.IPv4Address("10.1.2.3")),
    ("ip6", "IPv6", ipaddress.IPv6Address("2001:db8::1")),
    ("e8", "Enum8('a' = 1, 'b' = 2)", "b"),
    ("lc", "LowCardinality(String)", "low"),
    ("n", "Nullable(Int32)", None),
    ("arr", "Array(UInt16)", [1, 2, 3]),
    ("tup", "Tuple(String, Int8)", ("t", 1)),
    ("m", "Map(String, UInt8)", {"k": 1}),
    ("b", "Bool", True),
]


@pytest.fixture
def client(healthy_clickhouse_cluster: ClusterBase) -> Iterator[Any]:
    c = healthy_clickhouse_cluster.client(0)
    yield c
    c.close()


@pytest.fixture
def types_table(client: Any) -> Iterator[str]:
    client.command("DROP TABLE IF EXISTS compat_types")
    cols = ", ".join(f"{name} {ctype}" for name, ctype, _ in COLUMNS)
    client.command(f"CREATE TABLE compat_types ({cols}) ENGINE = MergeTree ORDER BY tuple()")
    yield "compat_types"
    client.command("DROP TABLE IF EXISTS compat_types")


def test_types_round_trip(client: Any, types_table: str) -> None:
    names = [name for name, _, _ in COLUMNS]
    row = [value for _, _, value in COLUMNS]
    summary = client.insert(types_table, [row], column_names=names)
    assert summary.written_rows == 1
    result = client.query(f"SELECT {', '.join(names)} FROM {types_table}")
    assert result.column_names == tuple(names)
    got = dict(zip(names, result.result_rows[0]))
    for name, _, value in COLUMNS:
        if name == "fs":
            assert got[name] in (b"abc", "abc")
        elif name == "dt64":
            assert got[name] == value
            assert got[name].utcoffset() == value.utcoffset()
        else:
            assert got[name] == value, name
    assert [t.name for t in result.column_types] == [ctype for _, ctype, _ in COLUMNS]


def test_pandas_arrow_numpy(client: Any) -> None:
    import pandas as pd

    client.command("DROP TABLE IF EXISTS compat_df")
    client.command("CREATE TABLE compat_df (id UInt32, name String, v Float64) ENGINE = MergeTree ORDER BY id")
    df = pd.DataFrame({"id": [1, 2, 3], "name": ["a", "b", "c"], "v": [0.5, 1.5, 2.5]})
    client.insert_df("compat_df", df)
    back = client.query_df("SELECT * FROM compat_df ORDER BY id")
    assert back["name"].tolist() == ["a", "b", "c"]
    assert back["v"].tolist() == [0.5, 1.5, 2.5]
    table = client.query_arrow("SELECT * FROM compat_df ORDER BY id")
    assert table.num_rows == 3
    client.insert_arrow("compat_df", table)
    assert client.command("SELECT count() FROM compat_df") == 6
    arr = client.query_np("SELECT id FROM compat_df ORDER BY id")
    assert arr.tolist() == [[1], [1], [2], [2], [3], [3]]
    client.command("DROP TABLE compat_df")


def test_server_and_client_side_parameters(client: Any) -> None:
    assert client.query("SELECT {x:UInt32} + 1, {s:String}", parameters={"x": 41, "s": "q'uote"}).result_rows == [
        (42, "q'uote")
    ]
    assert client.query("SELECT %(x)s + 1", parameters={"x": 9}).result_rows == [(10,)]


def test_sessions_and_temporary_tables(healthy_clickhouse_cluster: ClusterBase) -> None:
    c = healthy_clickhouse_cluster.client(0, session_id="compat-session")
    c.command("CREATE TEMPORARY TABLE IF NOT EXISTS tmp_rows (x UInt8)")
    c.insert("tmp_rows", [[1], [2], [3]], column_names=["x"])
    assert c.command("SELECT sum(x) FROM tmp_rows") == 6
    c.command("USE system")
    assert c.command("SELECT currentDatabase()") == "system"


@pytest.mark.parametrize("compress", [False, True, "lz4", "zstd", "gzip"])
def test_compression(healthy_clickhouse_cluster: ClusterBase, compress: Any) -> None:
    c = healthy_clickhouse_cluster.client(0, compress=compress)
    table = f"compat_comp_{compress}".lower()
    c.command(f"DROP TABLE IF EXISTS {table}")
    c.command(f"CREATE TABLE {table} (x UInt64, s String) ENGINE = MergeTree ORDER BY x")
    rows = [[i, f"row {i}" * 3] for i in range(5000)]
    c.insert(table, rows, column_names=["x", "s"])
    got = c.query(f"SELECT x, s FROM {table} ORDER BY x").result_rows
    assert [list(r) for r in got] == rows
    c.command(f"DROP TABLE {table}")


@pytest.mark.parametrize("encoding", ["gzip", "zstd", "lz4", "deflate"])
def test_http_response_compression_headers(healthy_clickhouse_cluster: ClusterBase, encoding: str) -> None:
    host = healthy_clickhouse_cluster.hosts[0]
    req = urllib.request.Request(
        f"http://{host}/?enable_http_compression=1",
        data=b"SELECT number FROM numbers(1000)",
        headers={"Accept-Encoding": encoding},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Encoding"] == encoding
        body = resp.read()
    from clickhouse_lb.testing import _encoding

    assert _encoding.decompress(body, encoding) == "".join(f"{i}\n" for i in range(1000)).encode()


@pytest.mark.parametrize(
    ("sql", "code", "status"),
    [("SELECT * FROM no_such_table", 60, 404), ("SELECT FROM WHERE", 62, 400), ("SELECT throwIf(1)", 395, 500)],
)
def test_errors_and_codes(
    healthy_clickhouse_cluster: ClusterBase, client: Any, sql: str, code: int, status: int
) -> None:
    with pytest.raises(DatabaseError) as info:
        client.query(sql)
    assert error_code(info.value) == code
    req = urllib.request.Request(f"http://{healthy_clickhouse_cluster.hosts[0]}/", data=sql.encode())
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(req, timeout=10)
    assert http_err.value.code == status
    assert http_err.value.headers["X-ClickHouse-Exception-Code"] == str(code)
    body = http_err.value.read().decode()
    assert body.startswith(f"Code: {code}. DB::Exception: ")
    assert "(version " in body


def test_unknown_setting_and_auth(healthy_clickhouse_cluster: ClusterBase) -> None:
    with pytest.raises(DatabaseError) as info:
        healthy_clickhouse_cluster.client(0).query("SELECT 1", settings={"no_such_setting_xyz": 1})
    assert error_code(info.value) == 115
    with pytest.raises(DatabaseError) as auth:
        healthy_clickhouse_cluster.client(0, password="wrong")
    assert error_code(auth.value) == 516


def test_url_settings_do_not_leak(client: Any) -> None:
    default = client.command("SELECT getSetting('max_block_size')")
    assert client.command("SELECT getSetting('max_block_size')", settings={"max_block_size": 1234}) == 1234
    assert client.command("SELECT getSetting('max_block_size')") == default


def test_command_return_values(client: Any) -> None:
    assert client.command("SELECT 1") == 1
    assert client.command("SELECT 'a', 'b'") == ["a", "b"]
    summary = client.command("CREATE TABLE IF NOT EXISTS compat_cmd (x UInt8) ENGINE = Memory")
    assert summary.written_rows == 0
    client.command("DROP TABLE compat_cmd")


def test_raw_query_csv_and_raw_insert(client: Any) -> None:
    assert client.raw_query("SELECT number, 'x' FROM numbers(3) FORMAT CSV") == b'0,"x"\n1,"x"\n2,"x"\n'
    client.command("DROP TABLE IF EXISTS compat_raw")
    client.command("CREATE TABLE compat_raw (a UInt8, b String) ENGINE = MergeTree ORDER BY a")
    client.raw_insert("compat_raw", ["a", "b"], "1,one\n2,two\n", fmt="CSV")
    client.raw_insert("compat_raw", ["a", "b"], b'{"a": 3, "b": "three"}\n', fmt="JSONEachRow")
    client.command("INSERT INTO compat_raw VALUES (4, 'four')")
    assert client.query("SELECT a, b FROM compat_raw ORDER BY a").result_rows == [
        (1, "one"),
        (2, "two"),
        (3, "three"),
        (4, "four"),
    ]
    client.command("DROP TABLE compat_raw")


def test_streaming(client: Any) -> None:
    total = 0
    with client.query_row_block_stream("SELECT number FROM numbers(200000)", settings={"max_block_size": 10000}) as s:
        for block in s:
            total += sum(row[0] for row in block)
    assert total == sum(range(200000))


def test_get_is_readonly_and_ping(healthy_clickhouse_cluster: ClusterBase) -> None:
    host = healthy_clickhouse_cluster.hosts[0]
    with urllib.request.urlopen(f"http://{host}/ping", timeout=10) as resp:
        assert resp.read() == b"Ok.\n"
    with urllib.request.urlopen(f"http://{host}/?query=" + urllib.parse.quote("SELECT 1 + 1"), timeout=10) as resp:
        assert resp.read() == b"2\n"
        assert resp.headers["X-ClickHouse-Format"] == "TabSeparated"
    sql = urllib.parse.quote("CREATE TABLE compat_get (x UInt8) ENGINE = Memory")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://{host}/?query={sql}", timeout=10)
    assert info.value.headers["X-ClickHouse-Exception-Code"] == "164"


def test_get_connections_stay_readonly_and_posts_stay_writable(healthy_clickhouse_cluster: ClusterBase) -> None:
    """GETs reuse read-only engine connections (readonly = 2: settings allowed, writes refused);
    POSTs never get one of them."""
    host = healthy_clickhouse_cluster.hosts[0]

    def get(sql: str, **params: str) -> bytes:
        query = urllib.parse.urlencode({"query": sql, **params})
        with urllib.request.urlopen(f"http://{host}/?{query}", timeout=10) as resp:
            return bytes(resp.read())

    for _ in range(3):  # the same pooled connection, again and again
        assert get("SELECT getSetting('max_threads')", max_threads="3") == b"3\n"
        assert get("SELECT getSetting('readonly')") == b"2\n"
        assert get("SELECT getSetting('max_threads')") != b"3\n"  # the previous GET's setting is gone
    create = urllib.request.Request(
        f"http://{host}/", data=b"CREATE TABLE IF NOT EXISTS compat_rw (x UInt8) ENGINE = Memory", method="POST"
    )
    with urllib.request.urlopen(create, timeout=10) as resp:
        assert resp.status == 200
    assert get("SELECT getSetting('readonly')", readonly="1") == b"1\n"  # stricter than a GET's 2
    with pytest.raises(urllib.error.HTTPError) as info:
        get("INSERT INTO compat_rw VALUES (1)")
    assert info.value.headers["X-ClickHouse-Exception-Code"] == "164"
    urllib.request.urlopen(urllib.request.Request(f"http://{host}/", data=b"DROP TABLE compat_rw"), timeout=10)
