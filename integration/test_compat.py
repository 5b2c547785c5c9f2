"""clickhouse-connect against one replica of the test cluster: types, formats, params, errors, compression,
and the fidelity fixes of the local replica (streamed results, external data, users, TLS, ...)."""

from __future__ import annotations

import datetime as dt
import decimal
import http.client
import ipaddress
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError, StreamFailureError
from clickhouse_connect.driver.external import ExternalData

from clickhouse_lb.core.classify import error_code
from clickhouse_lb.testing import ClusterBase, LocalCluster, User

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


# -- fidelity of the local replica ---------------------------------------------------------------

# Rows come one block at a time (max_block_size = 1) and slowly, so rows are out before row 30 fails.
LATE_FAILURE = "SELECT number, sleepEachRow(0.005) FROM numbers(60) WHERE throwIf(number = 30) = 0"


def _post(host: str, body: bytes, path: str = "/", headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    hostname, _, port = host.rpartition(":")
    conn = http.client.HTTPConnection(hostname, int(port), timeout=30)
    conn.request("POST", path, body=body, headers=headers or {})
    return conn.getresponse()


def test_result_streams_rows_then_the_exception_in_the_body(healthy_clickhouse_cluster: ClusterBase) -> None:
    """A failure after rows were sent: HTTP 200, chunked, no exception-code header, the rows, then
    the exception framed by the response's X-ClickHouse-Exception-Tag (ClickHouse 25.11+)."""
    path = "/?" + urllib.parse.urlencode({"max_block_size": 1, "wait_end_of_query": 0})
    resp = _post(healthy_clickhouse_cluster.hosts[0], LATE_FAILURE.encode(), path)
    body = resp.read()
    tag = resp.headers["X-ClickHouse-Exception-Tag"]
    assert resp.status == 200
    assert resp.headers["Transfer-Encoding"] == "chunked"
    assert resp.headers["X-ClickHouse-Exception-Code"] is None
    assert len(tag) == 16
    assert tag.isalnum()
    assert tag.islower()
    assert body.startswith(b"0\t0\n1\t0\n")
    rows, _, trailer = body.partition(b"__exception__\r\n" + tag.encode() + b"\r\n")
    lines = rows.splitlines()
    assert 2 <= len(lines) <= 30  # the rows the engine had produced before row 30 failed, in order
    assert lines == [f"{i}\t0".encode() for i in range(len(lines))]
    assert trailer.startswith(b"Code: 395. DB::Exception: ")
    assert trailer.endswith(b" " + tag.encode() + b"\r\n__exception__\r\n")


def test_failure_before_the_first_block_is_a_plain_error_response(healthy_clickhouse_cluster: ClusterBase) -> None:
    """Nothing sent yet: the status and X-ClickHouse-Exception-Code header carry the error."""
    path = "/?" + urllib.parse.urlencode({"wait_end_of_query": 0})
    resp = _post(healthy_clickhouse_cluster.hosts[0], b"SELECT throwIf(number = 0) FROM numbers(10)", path)
    body = resp.read()
    assert resp.status == 500
    assert resp.headers["X-ClickHouse-Exception-Code"] == "395"
    assert body.startswith(b"Code: 395. DB::Exception: ")
    assert b"__exception__" not in body


@pytest.mark.parametrize("compress", [False, "lz4", "zstd", "gzip"])
def test_clickhouse_connect_sees_a_mid_result_failure(healthy_clickhouse_cluster: ClusterBase, compress: Any) -> None:
    c = healthy_clickhouse_cluster.client(0, compress=compress)
    settings = {"max_block_size": 1, "wait_end_of_query": 0}
    with pytest.raises(StreamFailureError, match="Code: 395"):
        c.query(LATE_FAILURE, settings=settings).result_rows  # noqa: B018
    seen: list[int] = []
    late = pytest.raises(StreamFailureError, match="Code: 395")
    with late, c.query_rows_stream(LATE_FAILURE, settings=settings) as stream:
        seen.extend(row[0] for row in stream)
    assert seen == list(range(len(seen)))  # whatever arrived before the failure is intact
    assert c.command("SELECT 1") == 1  # and the connection is fine afterwards
    c.close()


def test_large_result_streams_in_blocks(healthy_clickhouse_cluster: ClusterBase) -> None:
    path = "/?" + urllib.parse.urlencode({"max_block_size": 1000, "wait_end_of_query": 0})
    resp = _post(healthy_clickhouse_cluster.hosts[0], b"SELECT number FROM numbers(50000)", path)
    assert resp.headers["Transfer-Encoding"] == "chunked"
    assert resp.read() == "".join(f"{i}\n" for i in range(50000)).encode()


def test_sessionless_request_after_a_mid_result_failure(healthy_clickhouse_cluster: ClusterBase) -> None:
    """Issue 17: a failed query used to leave its partial output on the pooled engine connection, so
    the next sessionless request (with a new setting) got HTTP 500 or the old query's bytes."""
    host, port = healthy_clickhouse_cluster.address(0)
    c = clickhouse_connect.get_client(host=host, port=port, autogenerate_session_id=False)
    for i in range(4):  # pooled connections are reused: hit them more than once
        with pytest.raises(DatabaseError) as info:
            c.query("SELECT number, throwIf(number = 5000) FROM numbers(10000)", settings={"max_block_size": 100})
        assert error_code(info.value) == 395
        settings = {"max_threads": 3 + i}
        assert c.query("SELECT 'next', getSetting('max_threads')", settings=settings).result_rows == [("next", 3 + i)]
    c.close()


def test_external_data_tables(client: Any) -> None:
    ext = ExternalData(file_name="ext_csv", data=b"1,one\n2,two\n", fmt="CSV", types="UInt8,String")
    ext.add_file(file_name="ext_tsv", data=b"2\tdeux\n3\ttrois\n", structure="id UInt8, word String")
    rows = client.query(
        "SELECT a._1, a._2, b.word FROM ext_csv AS a LEFT JOIN ext_tsv AS b ON a._1 = b.id ORDER BY a._1",
        external_data=ext,
    ).result_rows
    assert rows == [(1, "one", ""), (2, "two", "deux")]
    # external tables live for one query only
    with pytest.raises(DatabaseError) as info:
        client.query("SELECT * FROM ext_csv")
    assert error_code(info.value) == 60


def test_external_data_in_a_session(healthy_clickhouse_cluster: ClusterBase) -> None:
    c = healthy_clickhouse_cluster.client(0, session_id=f"compat-ext-{uuid.uuid4()}")
    ext = ExternalData(file_name="ids", data=b"7\n8\n", types="UInt64")
    assert c.query("SELECT sum(_1) FROM ids", external_data=ext).result_rows == [(15,)]
    assert c.query("SELECT sum(_1) FROM ids", external_data=ext).result_rows == [(15,)]  # dropped, made again
    c.close()


def test_external_data_without_types_is_refused(healthy_clickhouse_cluster: ClusterBase) -> None:
    boundary = "b0undary"
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"t\"; filename=\"t\"\r\n\r\n1\n\r\n--{boundary}--\r\n"
    ).encode()
    resp = _post(
        healthy_clickhouse_cluster.hosts[0],
        body,
        "/?" + urllib.parse.urlencode({"query": "SELECT * FROM t"}),
        {"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert resp.status == 400
    assert resp.headers["X-ClickHouse-Exception-Code"] == "36"
    assert b"external table t" in resp.read()


def test_binary_query_parameters_and_text(client: Any, healthy_clickhouse_cluster: ClusterBase) -> None:
    """Bytes that are not UTF-8 reach the engine unchanged, in parameters and in the query text."""
    raw = b"\x00\xff\xfe'\\x\x80"
    assert client.query("SELECT hex({v:String}) AS h", parameters={"v": raw}).result_rows == [(raw.hex().upper(),)]
    # clickhouse-connect splices a binary $name$ parameter raw between heredoc delimiters
    assert client.query("SELECT hex($b$) AS h", parameters={"$b$": raw}).result_rows == [(raw.hex().upper(),)]
    csv = b"x,y\n\xff\xfe,2\n"
    assert client.raw_query("SELECT hex(x), y FROM format(CSVWithNames, $d$)", parameters={"$d$": csv}) == b"FFFE\t2\n"
    resp = _post(healthy_clickhouse_cluster.hosts[0], b"SELECT hex('\xff\xfe\x80')")
    assert resp.read() == b"FFFE80\n"
    path = "/?" + urllib.parse.urlencode({"query": b"SELECT hex('\xc3\x28')"})
    with urllib.request.urlopen(f"http://{healthy_clickhouse_cluster.hosts[0]}{path}", timeout=10) as url_resp:
        assert url_resp.read() == b"C328\n"


def test_exists_for_names_with_glob_characters(client: Any, healthy_clickhouse_cluster: ClusterBase) -> None:
    assert client.command("EXISTS TABLE `a*b`") == 0
    assert client.command("EXISTS `SELECT * FROM numbers(3)`") == 0
    assert client.command("EXISTS TABLE system.numbers") == 1
    assert client.command("EXISTS TABLE system.`numbers`") == 1
    # (chdb takes a table name with * for a file glob in CREATE and DROP too, so no such table can be made)
    import pandas as pd
    from sqlalchemy import create_engine

    host, port = healthy_clickhouse_cluster.address(0)
    engine = create_engine(f"clickhousedb://default:@{host}:{port}/default")
    try:  # pandas asks EXISTS first to tell a query from a table name
        assert pd.read_sql("SELECT * FROM numbers(3)", engine)["number"].tolist() == [0, 1, 2]
    finally:
        engine.dispose()


def test_query_log(client: Any) -> None:
    marker = f"compat_qlog_marker_{uuid.uuid4().hex}"
    client.command(f"SELECT '{marker}'")
    client.command("SYSTEM FLUSH LOGS")
    rows = client.query(
        "SELECT type FROM system.query_log WHERE query LIKE {q:String} AND query NOT LIKE '%query_log%' ORDER BY type",
        parameters={"q": f"%{marker}%"},
    ).result_rows
    assert [r[0] for r in rows] == ["QueryStart", "QueryFinish"]


# -- users and TLS: a replica of its own --------------------------------------------------------


@pytest.fixture(scope="module")
def secure_cluster() -> Iterator[LocalCluster]:
    users = {"alice": User("alice-secret"), "reader": User("reader-secret", readonly=1)}
    with LocalCluster(replicas=1, password="root-pw", users=users, tls=True) as cluster:
        yield cluster


def test_users_and_passwords(secure_cluster: LocalCluster) -> None:
    alice = secure_cluster.client(0, username="alice", password="alice-secret")
    assert alice.command("SELECT 1") == 1
    alice.close()
    for username, password in [("alice", "wrong"), ("alice", ""), ("nobody", "x"), ("default", "")]:
        with pytest.raises(DatabaseError) as info:
            secure_cluster.client(0, username=username, password=password)
        assert error_code(info.value) == 516, (username, password)
        assert f"{username}: Authentication failed" in str(info.value)
    host = secure_cluster.hosts[0]
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(f"http://{host}/?user=alice&password=nope&query=SELECT+1", timeout=10)
    assert http_err.value.code == 403
    assert http_err.value.headers["X-ClickHouse-Exception-Code"] == "516"
    with pytest.raises(urllib.error.HTTPError) as binary_pw:  # not UTF-8: a wrong password, not a crash
        urllib.request.urlopen(f"http://{host}/?user=alice&password=%FF%FE&query=SELECT+1", timeout=10)
    assert binary_pw.value.code == 403


def test_readonly_user(secure_cluster: LocalCluster) -> None:
    reader = secure_cluster.client(0, username="reader", password="reader-secret")
    assert reader.command("SELECT 1") == 1
    for sql in ("CREATE TABLE compat_ro (x UInt8) ENGINE = Memory", "INSERT INTO system.numbers VALUES (1)"):
        with pytest.raises(DatabaseError) as info:
            reader.command(sql)
        assert error_code(info.value) == 164
    reader.close()
    query = urllib.parse.urlencode({"user": "reader", "password": "reader-secret", "readonly": 0})
    resp = _post(secure_cluster.hosts[0], b"CREATE TABLE compat_ro (x UInt8) ENGINE = Memory", f"/?{query}")
    assert resp.status == 500  # a request cannot lift its user's readonly
    assert resp.headers["X-ClickHouse-Exception-Code"] == "164"


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # verify=False, on purpose
def test_tls_secure_and_verify(secure_cluster: LocalCluster) -> None:
    c = secure_cluster.client(0, secure=True, password="root-pw")  # verified against the test CA
    assert c.command("SELECT 'over tls'") == "over tls"
    c.close()
    host, port = secure_cluster.https_address(0)
    unverified = clickhouse_connect.get_client(
        host=host, port=port, secure=True, verify=False, password="root-pw"
    )
    assert unverified.command("SELECT 2") == 2
    unverified.close()
    with pytest.raises(OperationalError) as info:  # verify=True with the system CAs: an unknown issuer
        clickhouse_connect.get_client(host=host, port=port, secure=True, verify=True, password="root-pw")
    assert "certificate" in str(info.value.__cause__).lower() or "SSL" in str(info.value.__cause__)
    ctx = ssl.create_default_context(cafile=str(secure_cluster.ca_path))
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=10)
    conn.request("GET", "/ping")
    assert conn.getresponse().read() == b"Ok.\n"
    conn.close()
    plain = http.client.HTTPConnection(host, port, timeout=10)  # plain HTTP to the HTTPS port
    plain.request("GET", "/ping")  # a TLS server reads this as a bad handshake and hangs up
    with pytest.raises((http.client.HTTPException, OSError)):
        plain.getresponse()
    plain.close()


def test_tls_handshake_is_not_slow(secure_cluster: LocalCluster) -> None:
    """A client that gives up its handshake must not block the listener for anybody else."""
    host, port = secure_cluster.https_address(0)
    import socket

    stalled = socket.create_connection((host, port), timeout=10)  # never speaks TLS
    try:
        started = time.monotonic()
        c = secure_cluster.client(0, secure=True, password="root-pw")
        assert c.command("SELECT 3") == 3
        c.close()
        assert time.monotonic() - started < 10
    finally:
        stalled.close()


def test_client_protocol_version_is_honoured(healthy_clickhouse_cluster: ClusterBase, client: Any) -> None:
    """With client_protocol_version, Native blocks start with their block info and DateTime
    columns keep their time zone (clickhouse-connect probes for it and then relies on it)."""
    host = healthy_clickhouse_cluster.hosts[0]
    probe = {"default_format": "Native", "client_protocol_version": "54405"}
    body = _post(host, b"SELECT 1 AS check", "/?" + urllib.parse.urlencode(probe)).read()
    assert body[:8] == b"\x01\x00\x02\xff\xff\xff\xff\x00"
    assert body[8:16] == b"\x01\x01\x05check"
    body0 = _post(host, b"SELECT 1 AS check", "/?default_format=Native").read()
    assert body0[:8] == b"\x01\x01\x05check"  # revision 0: no block info, as before
    assert client.protocol_version == 54405
    sql = "SELECT number, toDateTime(number, 'Asia/Tokyo') AS tokyo, toDateTime(number) AS plain FROM numbers(25000)"
    settings = {"max_block_size": 10000}
    result = client.query(sql, settings=settings)
    assert [t.name for t in result.column_types] == ["UInt64", "DateTime('Asia/Tokyo')", "DateTime"]
    assert result.result_rows[-1][1] == dt.datetime(1970, 1, 1, 15, 56, 39, tzinfo=ZoneInfo("Asia/Tokyo"))
    with client.query_rows_stream(sql, settings={**settings, "wait_end_of_query": 0}) as stream:
        rows = list(stream)
    assert len(rows) == 25000
    assert rows[-1][1].utcoffset() == dt.timedelta(hours=9)


def test_head_of_a_streamed_query_releases_it(healthy_clickhouse_cluster: ClusterBase) -> None:
    """HEAD sends no body, so the stream is never read: its query id and session must still be freed."""
    hostname, _, port = healthy_clickhouse_cluster.hosts[0].rpartition(":")
    conn = http.client.HTTPConnection(hostname, int(port), timeout=30)
    params = {
        "query": "SELECT number FROM numbers(100000)",
        "max_block_size": 1000,
        "wait_end_of_query": 0,
        "query_id": f"compat-head-{uuid.uuid4()}",
        "session_id": f"compat-head-{uuid.uuid4()}",
    }
    path = "/?" + urllib.parse.urlencode(params)
    conn.request("HEAD", path)
    head = conn.getresponse()
    head.read()
    assert head.status == 200
    conn.request("GET", path)  # same connection: served after the HEAD is finished with
    again = conn.getresponse()
    assert again.status == 200, again.read()
    assert again.read() == "".join(f"{i}\n" for i in range(100000)).encode()
    conn.close()


def test_tls_with_same_port_replicas_and_a_restart() -> None:
    """Each replica's HTTPS port is found in shared-port mode too, and kept across a restart."""
    with LocalCluster(replicas=2, shared_port=True, tls=True) as cluster:
        assert [cluster.client(i, secure=True).command("SELECT getMacro('replica')") for i in range(2)] == ["r1", "r2"]
        before = cluster.https_address(1)
        cluster.restart(1)
        assert cluster.https_address(1) == before
        assert cluster.client(1, secure=True).command("SELECT 1") == 1
