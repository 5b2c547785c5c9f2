"""Read-your-writes, on fake replicas: which replica a read goes to after a write, what it asks
another replica before reading there, what it leaves alone (the order with no recent write, the
settings the server sees), and the settings' parsing. Against real replication (the engine,
``delay_replication``): integration/test_read_your_writes.py."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterator

import pytest

from clickhouse_lb.config.pool_config import resolve_pool_config, sync_client_option_names
from clickhouse_lb.config.read_your_writes import ReadYourWritesSettings
from clickhouse_lb.core import shared_state
from clickhouse_lb.core.read_your_writes import (
    DATABASE_POSITIONS,
    forget_writes,
    order_for_read,
    recent_writes,
    record_write,
    written_table,
)
from clickhouse_lb.errors import ConfigurationError, ReadYourWritesError
from clickhouse_lb.pools._read_your_writes import _BLOCKS

from .fakes import FakeCluster, make_pool, refused, server_error

ADDRESSES = ["a:8123", "b:8123", "c:8123"]


@pytest.fixture(autouse=True)
def _no_remembered_writes() -> Iterator[None]:
    forget_writes()
    yield
    forget_writes()


@pytest.fixture
def abc() -> FakeCluster:
    return FakeCluster("a", "b", "c")


def served_by(result: str) -> str:
    return result.split("@")[1]


@pytest.mark.parametrize("strategy", ["random", "round_robin", "in_order", "first_or_random"])
def test_with_no_recent_write_reads_are_balanced_exactly_as_with_it_off(strategy: str) -> None:
    sequences = []
    for options in ({}, {"read_your_writes": 1}):
        shared_state.registry.clear()  # each pool from the same balancing state
        cluster = FakeCluster("a", "b", "c")
        pool = make_pool(cluster, seed=11, load_balancing=strategy, **options)
        sequences.append([served_by(pool.query("SELECT 1")) for _ in range(60)])
    if strategy == "round_robin":  # it starts at a random replica: compare the steps
        sequences = [[(ord(h) - ord(seq[0])) % 3 for h in seq] for seq in sequences]
    assert sequences[0] == sequences[1]
    assert strategy in ("in_order", "first_or_random") or len(set(sequences[0])) > 1


def test_a_read_after_a_write_goes_to_the_replica_that_acknowledged_it(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin", read_your_writes=1)
    for _ in range(9):
        writer = served_by(pool.insert("t", [[1]], column_names=["x"]))
        assert served_by(pool.query("SELECT count() FROM t")) == writer
    off = make_pool(FakeCluster("a", "b", "c"), load_balancing="round_robin")
    for _ in range(3):  # off: round_robin moves on
        writer = served_by(off.insert("t", [[1]], column_names=["x"]))
        assert served_by(off.query("SELECT count() FROM t")) != writer


def test_the_rest_of_the_plan_keeps_the_strategys_order() -> None:
    record_write("b:8123", "t", now=10.0, window=5.0)
    writes = recent_writes(ADDRESSES, now=11.0, window=5.0)
    assert order_for_read([2, 0, 1], ADDRESSES, writes) == [1, 2, 0]
    assert order_for_read([0, 1, 2], ADDRESSES, ()) == [0, 1, 2]


def test_a_write_stops_steering_after_the_window_and_on_other_replica_sets() -> None:
    record_write("b:8123", "t", now=10.0, window=5.0)
    assert recent_writes(ADDRESSES, now=14.9, window=5.0)
    assert recent_writes(ADDRESSES, now=15.0, window=5.0) == ()
    assert recent_writes(["x:8123", "y:8123"], now=11.0, window=5.0) == ()


def test_the_setting_never_reaches_the_server(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    pool.insert("t", [[1]], column_names=["x"], settings={"read_your_writes": 1, "max_threads": 2})
    pool.query("SELECT 1", settings={"read_your_writes": "1"})
    for method, _args, kwargs in abc["a"].calls:
        assert "read_your_writes" not in (kwargs.get("settings") or {}), method
    assert abc["a"].calls[0][2]["settings"]["max_threads"] == 2


def test_per_statement_setting_steers_only_the_statements_that_give_it(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin")
    on = {"read_your_writes": 1}
    writer = served_by(pool.insert("t", [[1]], column_names=["x"], settings=on))
    assert served_by(pool.query("SELECT 1", settings=on)) == writer
    assert served_by(pool.query("SELECT 1", settings=on)) == writer
    plain = [served_by(pool.query("SELECT 1")) for _ in range(3)]
    assert len(set(plain)) == 3  # round_robin as ever
    pool_on = make_pool(FakeCluster("a", "b", "c"), load_balancing="round_robin", read_your_writes=1)
    writer = served_by(pool_on.insert("t", [[1]], column_names=["x"]))
    readers = {served_by(pool_on.query("SELECT 1", settings={"read_your_writes": 0})) for _ in range(3)}
    assert len(readers) == 3  # 0 turns it off for that statement


def test_a_block_scopes_it_to_its_thread(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin")
    seen_elsewhere: list[str] = []
    with pool.read_your_writes():
        writer = served_by(pool.insert("t", [[1]], column_names=["x"]))
        other = threading.Thread(target=lambda: seen_elsewhere.extend(
            served_by(pool.query("SELECT 1")) for _ in range(3)))
        other.start()
        other.join()
        assert {served_by(pool.query("SELECT 1")) for _ in range(3)} == {writer}
    assert len(set(seen_elsewhere)) == 3  # another thread has no write to follow
    assert pool._ryw.armed is False
    assert len({served_by(pool.query("SELECT 1")) for _ in range(3)}) == 3  # block closed


def test_one_block_object_nests(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin")
    block = pool.read_your_writes()
    with block:
        with block:
            pass
        assert pool._ryw in _BLOCKS.get()  # the outer entry is still open
    assert _BLOCKS.get() == ()
    assert pool._ryw.armed is False


def test_one_block_object_is_entered_by_two_threads_at_once(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin")
    block = pool.read_your_writes()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []
    left_open: list[int] = []

    def enter_and_leave(entered: threading.Event, wait_for: threading.Event, left: threading.Event | None) -> None:
        try:
            with block:
                entered.set()
                assert wait_for.wait(10)
            left_open.append(len(_BLOCKS.get()))
        except BaseException as exc:
            errors.append(exc)
        finally:
            if left is not None:
                left.set()

    # the first thread leaves while the second is still inside, then the second leaves
    first = threading.Thread(target=enter_and_leave, args=(first_in, second_in, first_out))
    second = threading.Thread(target=enter_and_leave, args=(second_in, first_out, None))
    first.start()
    assert first_in.wait(10)
    second.start()
    first.join()
    second.join()
    assert errors == []
    assert left_open == [0, 0]  # each thread's block closed in that thread
    assert pool._ryw.armed is False
    assert pool._ryw._open == 0


def test_when_the_writer_fails_the_next_replica_syncs_the_table_before_the_read(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order", read_your_writes=1, database="db")
    pool.insert("events", [[1]], column_names=["x"])
    abc["a"].outcomes = [refused]
    assert served_by(pool.query("SELECT count() FROM events")) == "b"
    (sync, sync_args, sync_kwargs), (read, _, _) = abc["b"].calls[-2:]
    assert (sync, sync_args, read) == ("command", ("SYSTEM SYNC REPLICA db.events",), "query")
    assert 0 < sync_kwargs["settings"]["receive_timeout"] <= 5.0
    # b caught up: later reads may go there without another sync while a is down
    pool.query("SELECT 1")
    assert [c[0] for c in abc["b"].calls[-2:]] == ["query", "query"]


def test_a_database_assigned_to_the_pool_is_the_one_writes_are_recorded_in(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order", read_your_writes=1, database="db")
    pool.database = "other"
    pool.insert("events", [[1]], column_names=["x"])
    abc["a"].outcomes = [refused]
    assert served_by(pool.query("SELECT count() FROM events")) == "b"
    assert abc["b"].calls[-2][:2] == ("command", ("SYSTEM SYNC REPLICA other.events",))


def test_a_replica_that_cannot_catch_up_in_time_raises_the_documented_error(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order", read_your_writes=1, read_your_writes_timeout_ms=250)
    pool.insert("events", [[1]], column_names=["x"])
    abc["a"].outcomes = [refused]
    abc["b"].outcomes = [lambda: server_error(159, "TIMEOUT_EXCEEDED"), "ok"]
    with pytest.raises(ReadYourWritesError) as caught:
        pool.query("SELECT count() FROM events")
    error = caught.value
    assert (error.writer, error.table, error.replica, error.timeout) == ("a:8123", "events", "b:8123", 0.25)
    assert "read_your_writes_timeout_ms=250" in str(error)
    assert [c[0] for c in abc["c"].calls] == []  # stopped: c would not have the write either


def test_a_replica_down_during_its_catch_up_is_failed_over_as_usual(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order", read_your_writes=1)
    pool.insert("events", [[1]], column_names=["x"])
    abc["a"].outcomes = [refused]
    abc["b"].outcomes = [refused]
    assert served_by(pool.query("SELECT 1")) == "c"
    assert [c[0] for c in abc["c"].calls] == ["command", "query"]


def test_a_command_write_steers_reads_but_cannot_be_synced(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin", read_your_writes=1)
    writer = served_by(pool.command("ALTER TABLE t DELETE WHERE 1"))
    assert served_by(pool.query("SELECT 1")) == writer
    abc[writer].outcomes = [refused]
    other = served_by(pool.query("SELECT 1"))
    assert other != writer
    assert [c[0] for c in abc[other].calls] == ["query"]  # no table to sync: window only


@pytest.mark.parametrize(
    ("call", "database", "expected"),
    [
        (("insert", ("events", [[1]]), {}, None), None, "events"),
        (("insert", ("events", [[1]]), {"database": "db"}, None), "other", "db.events"),
        (("insert", ("db.events", [[1]]), {}, None), "other", "db.events"),
        (("insert", ("my events", [[1]]), {}, None), "db", "db.`my events`"),
        (("raw_insert", (), {"table": "t"}, None), "db", "db.t"),
        (("command", (), {}, "INSERT INTO db.t VALUES (1)"), None, "db.t"),
        (("query", (), {}, "  insert into table `x y` SELECT 1"), None, "`x y`"),
        (("command", (), {}, "INSERT INTO FUNCTION s3('u') VALUES (1)"), None, None),
        (("command", (), {}, "ALTER TABLE t DELETE WHERE 1"), None, None),
        # leading comments and brackets, and a leading WITH clause, before the INSERT
        (("command", (), {}, "/* tag */ INSERT INTO t VALUES (1)"), "db", "db.t"),
        (("command", (), {}, "-- c\nINSERT INTO t VALUES (1)"), "db", "db.t"),
        (("command", (), {}, "# c\n  /* a */ -- b\n insert into other.t VALUES (1)"), "db", "other.t"),
        (("command", (), {}, "(INSERT INTO t SELECT 1)"), "db", "db.t"),
        (("command", (), {}, "WITH 1 AS x INSERT INTO t SELECT x"), "db", "db.t"),
        (("command", (), {}, b"/* tag */ INSERT INTO t VALUES (1)"), "db", "db.t"),
        (("command", (), {}, "/* INSERT INTO t */ SELECT 1"), "db", None),
        # the database given positionally, where each insert method takes it
        (("insert", ("t", [[1]], ["k"], "other"), {}, None), "db", "other.t"),
        (("insert_df", ("t", None, "other"), {}, None), "db", "other.t"),
        (("insert_arrow", ("t", None, "other"), {}, None), "db", "other.t"),
        (("insert_df_arrow", ("t", None, "other"), {}, None), "db", "other.t"),
        (("insert", ("t", [[1]], ["k"], None), {}, None), "db", "db.t"),
    ],
)
def test_the_table_of_a_write(call: tuple[str, tuple[object, ...], dict[str, object], str | None],
                              database: str | None, expected: str | None) -> None:
    assert written_table(*call, database) == expected


@pytest.mark.parametrize("client_class", ["Client", "AsyncClient"])
def test_the_database_positions_are_the_clients(client_class: str) -> None:
    from clickhouse_connect.driver import asyncclient, client

    cls = getattr(client, "Client", None) if client_class == "Client" else asyncclient.AsyncClient
    for method, at in DATABASE_POSITIONS.items():
        names = [name for name in inspect.signature(getattr(cls, method)).parameters if name != "self"]
        assert names.index("database") == at, method


def test_settings_parse_from_keywords_and_dsn_with_bounds() -> None:
    config = resolve_pool_config(
        None, dsn="clickhouse://a:8123,b:8123/db?read_your_writes=1&read_your_writes_window_ms=800",
        balancing={"read_your_writes_timeout_ms": "1200"}, client_options={},
        valid_client_options=sync_client_option_names(),
    )
    assert config.read_your_writes == ReadYourWritesSettings(True, 800, 1200)
    assert "settings" not in config.client_options  # not sent to the server as a setting
    with pytest.raises(ConfigurationError, match=r"read_your_writes_window_ms 0.*1\.\.86400000 ms"):
        resolve_pool_config(["a:8123"], dsn=None, balancing={"read_your_writes_window_ms": 0},
                            client_options={}, valid_client_options=sync_client_option_names())
    with pytest.raises(ConfigurationError, match="read_your_writes 'maybe'"):
        make_pool(FakeCluster("a"), read_your_writes="maybe")
    with pytest.raises(ConfigurationError, match="read_your_writes 'sometimes'"):
        make_pool(FakeCluster("a")).query("SELECT 1", settings={"read_your_writes": "sometimes"})


def test_async_pool_follows_the_write_and_makes_another_replica_catch_up() -> None:
    from .test_aio import AsyncFakeCluster
    from .test_aio import make_pool as make_async_pool
    from .test_aio import refused as async_refused

    async def main() -> None:
        cluster = AsyncFakeCluster("a", "b", "c")
        pool = make_async_pool(cluster, load_balancing="round_robin")
        async with pool.read_your_writes():
            writer = served_by(await pool.insert("events", [[1]], column_names=["x"]))
            assert {served_by(await pool.query("SELECT 1")) for _ in range(3)} == {writer}
            cluster[writer].outcomes = [async_refused]
            other = served_by(await pool.query("SELECT count() FROM events"))
        assert other != writer
        (sync, sync_args, _), (read, _, _) = cluster[other].calls[-2:]
        assert (sync, sync_args, read) == ("command", ("SYSTEM SYNC REPLICA events",), "query")
        await pool.close()

    asyncio.run(main())


def test_a_sqlalchemy_url_takes_the_settings_like_the_other_pool_settings() -> None:
    from sqlalchemy.engine import make_url

    from clickhouse_lb.sqlalchemy.url import engine_args_from_url

    url = make_url("clickhousedb+lb://default:@a:8123/db?host=b:8123&read_your_writes=1&read_your_writes_timeout_ms=300")
    config = engine_args_from_url(url).config
    assert config.read_your_writes == ReadYourWritesSettings(True, 5000, 300)
    assert "read_your_writes" in repr(config)
