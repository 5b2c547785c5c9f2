"""The statement classification the local cluster's replication relies on (pure functions)."""

from __future__ import annotations

import pytest

from clickhouse_lb.testing._sql import (
    classify,
    expand_macros,
    inline_settings,
    inserts_a_select,
    literal,
    literal_table,
    replace_spans,
    tokens,
)


def test_insert_target_with_database_and_quoted_names() -> None:
    st = classify('INSERT INTO `my db`."t 1" (a, b) FORMAT Native')
    assert st is not None
    assert st.kind == "insert"
    assert st.table is not None
    assert st.table.resolve("default") == ("my db", "t 1")
    assert st.local_sql[st.table.end :] == " (a, b) FORMAT Native"


def test_insert_into_a_table_function_is_not_a_table_write() -> None:
    assert classify("INSERT INTO FUNCTION file('x.csv') SELECT 1") is None


def test_on_cluster_is_found_outside_strings_and_removed() -> None:
    st = classify("ALTER TABLE t ON CLUSTER lb_cluster UPDATE s = 'ON CLUSTER x' WHERE 1")
    assert st is not None
    assert st.cluster == "lb_cluster"
    assert st.kind == "table_write"
    assert st.local_sql == "ALTER TABLE t  UPDATE s = 'ON CLUSTER x' WHERE 1"
    assert classify("SELECT 'ON CLUSTER x'") is None


@pytest.mark.parametrize(
    ("engine", "local", "path", "replica"),
    [
        ("ReplicatedMergeTree", "MergeTree", None, None),
        ("ReplicatedMergeTree()", "MergeTree()", None, None),
        ("ReplicatedMergeTree('/p/{shard}', '{replica}')", "MergeTree()", "/p/{shard}", "{replica}"),
        ("ReplicatedReplacingMergeTree('/p', 'r', ver)", "ReplacingMergeTree(ver)", "/p", "r"),
        ("ReplicatedSummingMergeTree((a, b))", "SummingMergeTree((a, b))", None, None),
    ],
)
def test_replicated_engines_map_to_their_mergetree(
    engine: str, local: str, path: str | None, replica: str | None
) -> None:
    sql = f"CREATE TABLE IF NOT EXISTS db.t (a UInt8, b UInt8, ver UInt8) ENGINE = {engine} ORDER BY a"
    st = classify(sql)
    assert st is not None
    assert st.kind == "create_table"
    assert st.engine is not None
    assert (st.engine.local_clause, st.engine.zookeeper_path, st.engine.replica_name) == (local, path, replica)
    rewritten = replace_spans(sql, [(st.engine.start, st.engine.end, st.engine.local_clause)])
    assert rewritten == sql.replace(engine, local)


def test_plain_create_is_left_to_the_engine() -> None:
    assert classify("CREATE TABLE t (x UInt8) ENGINE = MergeTree ORDER BY x") is None


def test_statement_kinds() -> None:
    kinds = {
        "TRUNCATE TABLE IF EXISTS t": "table_write",
        "DELETE FROM t WHERE x = 1": "table_write",
        "OPTIMIZE TABLE t FINAL": "table_write",
        "DROP TABLE IF EXISTS t SYNC": "drop_table",
        "DROP DATABASE d": "drop_database",
        "RENAME TABLE a TO b, c.d TO c.e": "rename",
        "SYSTEM SYNC REPLICA db.t LIGHTWEIGHT": "sync_replica",
        "SYSTEM STOP FETCHES": "fetches",
        "SYSTEM START REPLICATION QUEUES": "fetches",
        "SELECT * FROM system.replicas": "select",
        "CREATE DATABASE d ENGINE = Replicated('/p', '{shard}', '{replica}')": "create_database",
    }
    for sql, kind in kinds.items():
        st = classify(sql)
        assert st is not None, sql
        assert st.kind == kind, sql
    assert classify("SELECT * FROM system.tables") is None
    assert classify("SYSTEM FLUSH LOGS") is None


def test_rename_pairs() -> None:
    st = classify("RENAME TABLE a TO b, c.d TO c.e")
    assert st is not None
    assert [(a.resolve("x"), b.resolve("x")) for a, b in st.renames] == [
        (("x", "a"), ("x", "b")),
        (("c", "d"), ("c", "e")),
    ]


def test_macros() -> None:
    macros = {"shard": "01", "replica": "r2", "uuid": "u-1"}
    assert expand_macros("/clickhouse/tables/{uuid}/{shard}", macros) == "/clickhouse/tables/u-1/01"
    with pytest.raises(KeyError, match="layer"):
        expand_macros("/t/{layer}", macros)


def test_inline_settings_of_an_insert() -> None:
    sql = "INSERT INTO t SETTINGS insert_deduplication_token = 'a''b', insert_deduplicate = 1 VALUES (1)"
    assert inline_settings(sql) == {"insert_deduplication_token": "a'b", "insert_deduplicate": "1"}


def test_tokens_skip_comments_and_track_depth() -> None:
    toks = tokens("SELECT (1) -- ON CLUSTER x\n/* system.replicas */")
    assert [t.text for t in toks] == ["SELECT", "(", "1", ")"]
    assert [t.depth for t in toks] == [0, 0, 1, 0]


def test_insert_select_is_told_from_values_and_formats() -> None:
    assert inserts_a_select(" (a, b) SELECT number, 1 FROM numbers(3)")
    assert inserts_a_select(" WITH 1 AS x SELECT x")
    assert not inserts_a_select(" (a) VALUES ((SELECT 1))")
    assert not inserts_a_select(" (a) FORMAT Native")


def test_literals_and_literal_tables() -> None:
    assert [literal(v) for v in (None, True, 3, "it's")] == ["NULL", "1", "3", "'it\\'s'"]
    assert literal({"r1": 1}) == "map('r1', 1)"
    columns = [("name", "String"), ("n", "UInt8"), ("m", "Map(String, UInt8)")]
    assert literal_table(columns, [{"name": "a"}]) == (
        "(SELECT CAST('a' AS String) AS `name`, defaultValueOfTypeName('UInt8') AS `n`, "
        "defaultValueOfTypeName('Map(String, UInt8)') AS `m`)"
    )
    assert literal_table(columns, []).endswith(" LIMIT 0)")


def test_insert_settings_go_after_the_column_list() -> None:
    from clickhouse_lb.testing._sql import with_insert_settings

    def put(sql: str) -> str | None:
        st = classify(sql)
        assert st is not None
        assert st.table is not None
        return with_insert_settings(sql, st.table.end, {"insert_deduplication_token": "t1"})

    assert put("INSERT INTO t (a, b) FORMAT Native") == (
        "INSERT INTO t (a, b) SETTINGS insert_deduplication_token = 't1' FORMAT Native"
    )
    want = "INSERT INTO db.t SETTINGS insert_deduplication_token = 't1' VALUES (1)"
    assert put("INSERT INTO db.t VALUES (1)") == want
    assert put("INSERT INTO t (a)") == "INSERT INTO t (a) SETTINGS insert_deduplication_token = 't1'"
    assert put("INSERT INTO t(a, tuple(b))SELECT 1") == (
        "INSERT INTO t(a, tuple(b)) SETTINGS insert_deduplication_token = 't1' SELECT 1"
    )
    assert put("INSERT INTO t (a) SETTINGS x = 1 VALUES (1)") is None  # its own clause: SET instead
    assert put("INSERT INTO t SETTINGS x = 1 VALUES (1)") is None
    assert put("INSERT INTO t (SELECT 1)") is None
