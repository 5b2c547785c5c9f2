"""Replication for the local cluster: what ClickHouse Keeper and the replication queue do, on disk.

One :class:`Replication` per replica process. chdb cannot run ``ReplicatedMergeTree`` (no
Keeper), so:

* ``CREATE TABLE ... ENGINE = Replicated*MergeTree(path, replica, ...)`` creates the matching
  ``*MergeTree`` table (with ``non_replicated_deduplication_window``, see below) and records the
  table's expanded Keeper path (macros ``{shard}``, ``{replica}``, ``{uuid}``, ``{database}``,
  ``{table}``; default ``/clickhouse/tables/{uuid}/{shard}`` and ``{replica}`` as in
  docker-compose.yml) in this replica's catalog. Tables on different replicas with the same path
  are replicas of one table, as with Keeper. A table created later on another replica first
  replays the path's history (ClickHouse clones the parts).
* Shards: the log is the whole cluster's, as Keeper is; a sharded cluster's replicas differ in
  their ``shard`` macro, so the default path keeps each shard's tables a replica set of their
  own (an explicit path without ``{shard}`` is one table across shards, as on a server). A
  replica skips the entries of paths it holds no table of (marking them applied).
* Writes to a replicated table (inserts, ALTER, TRUNCATE, lightweight DELETE, OPTIMIZE) run on
  the replica that received them and are appended to the shared :class:`ReplicationLog` before
  the answer is sent; every other replica's *applier* thread applies them in log order.
* Each replica's applier sends a table's due inserts of one statement shape to the engine as
  one insert (see :mod:`clickhouse_lb.testing._batching` for when, and why deduplication stays
  exact).
* ``... ON CLUSTER <name>`` runs the statement on the receiving replica, appends it to the log,
  and waits (up to ``distributed_ddl_task_timeout``) until every *active* replica has run it
  too. Replicas apply ON CLUSTER entries at once (ClickHouse's DDL worker is not the
  replication queue): replication delay and STOP FETCHES do not hold them back.
* Insert deduplication: the block id is ``insert_deduplication_token`` or, without one, a hash of
  the insert's columns, format and data as sent. An insert whose block id is among the table's
  last ``replicated_deduplication_window`` blocks (and younger than
  ``replicated_deduplication_window_seconds``; both the engine's defaults) is acknowledged and
  not written, on whichever replica it arrives. Every replica inserts a block with its block id
  as the engine's own ``insert_deduplication_token`` (in a ``SETTINGS`` clause of the INSERT
  when its shape allows, which costs no query; else with a ``SET``; local tables carry
  ``non_replicated_deduplication_window``), so applying an entry twice under the same token (a
  replica killed between applying and recording it) is a no-op; the engine insert in flight is
  recorded before it is sent, so a restart sends the same entries under the same token, not the
  entry inside a new batch, and a mutation only where it left none on disk
  (:mod:`clickhouse_lb.testing._inflight`). ``INSERT ... SELECT`` is deduplicated by token only
  (its text does not identify its rows).
* Ordering (see :mod:`clickhouse_lb.testing._replog` for the locks): an insert into a replicated
  table holds the log's writer lock *shared* while it runs on the receiving replica and is
  logged, so inserts (into one table or many, on any replica) run concurrently: they commute,
  and of a block logged twice by two concurrent inserts only the first entry is applied (see
  :mod:`clickhouse_lb.testing._batching` for which replica sends what alone). Every other
  replicated write (ALTER, TRUNCATE, DELETE, OPTIMIZE), every ON CLUSTER statement and
  CREATE/DROP/RENAME of a replicated table hold it *exclusively*: one at a time, after the
  inserts in flight, in log order. An insert
  whose replica still has an older non-insert entry of its table queued takes the exclusive
  path (and applies that entry first), so every replica sees the two in log order.
  LocalCluster.pause takes the lock exclusively before SIGSTOP, so a paused replica holds none.
* Crash safety of a write (the order matters): the write is recorded as in progress (a file of
  its own per write, so concurrent writes do not share one), runs on the engine, is appended to
  the log (fsynced), is marked applied here, and only then is the record removed and the
  statement acknowledged. A replica restarted with records left rolls them forward (see
  :meth:`Replication._finish_interrupted_write`), and drops the engine's deduplication records of
  parts that never reached the disk first (:mod:`clickhouse_lb.testing._dedup_repair`).

Faults (per replica, not persisted across a restart): ``delay`` (an entry is applied once it is
that many seconds old) and ``stopped`` (nothing is applied; ``SYSTEM STOP FETCHES`` /
``SYSTEM STOP REPLICATION QUEUES`` set it too). A write to a replicated table whose replica still
has older non-insert entries of that table queued applies them first, so every replica applies
them in the same order.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import threading
import time
import uuid as uuid_module
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clickhouse_lb.testing import _batching, _inflight, _sql, _system_tables
from clickhouse_lb.testing._engine import ClickHouseError, EngineConn, Result
from clickhouse_lb.testing._replog import Entry, ReplicationLog

log = logging.getLogger("clickhouse_lb.testing.replication")

DEFAULT_ZOOKEEPER_PATH = "/clickhouse/tables/{uuid}/{shard}"
DEFAULT_REPLICA_NAME = "{replica}"
#: A replica whose state file was not touched for this long is not active (killed or paused).
ACTIVE_WITHIN = 3.0
_HEARTBEAT = 0.5
_POLL = 0.02
_INTERESTING = re.compile(
    # A block comment ends at its first "*/" (a lazy ".*?" there backtracks exponentially on many).
    r"^\s*(?:(?:--[^\n]*\n|/\*(?:[^*]|\*(?!/))*\*/)\s*)*"
    r"(INSERT|CREATE|ATTACH|REPLACE|DROP|DETACH|ALTER|TRUNCATE|OPTIMIZE|"
    r"DELETE|RENAME|EXCHANGE|SYSTEM|SELECT|WITH|SHOW|DESC|DESCRIBE|EXPLAIN|\()",
    re.I | re.S,
)
_SYSTEM_TABLE_HINT = re.compile(r"system[`\"]?\s*\.\s*[`\"]?(?:clusters|replicas|tables)", re.I)
_REPLICATED_DATABASE = re.compile(r"\bENGINE\s*=\s*Replicated\b", re.I)


class RunStatement:
    """Runs a (possibly rewritten) statement the way the request asked (its connection, its
    insert data and format, its query parameters); ``data``/``format`` are the insert's."""

    def __init__(self, run: Callable[[str], Result], data: bytes = b"", fmt: str | None = None) -> None:
        self._run = run
        self.data = data
        self.format = fmt

    def __call__(self, sql: str) -> Result:
        return self._run(sql)


@dataclass
class TableInfo:
    """A local table that is a replica of a replicated table."""

    database: str
    table: str
    engine: str
    zookeeper_path: str
    replica_name: str
    uuid: str
    #: The engine's first two arguments as the CREATE wrote them (or the defaults), unexpanded,
    #: as a server keeps them in the table's metadata (``system.tables.engine_full``).
    written_path: str = DEFAULT_ZOOKEEPER_PATH
    written_replica: str = DEFAULT_REPLICA_NAME


@dataclass
class _PathView:
    """What the log says about one replicated table (Keeper path), across the cluster."""

    seqs: list[int] = field(default_factory=list)  # entries of this path since it was (re)created
    replicas: set[str] = field(default_factory=set)
    hosts: dict[str, str] = field(default_factory=dict)  # replica name -> the replica process holding it
    blocks: OrderedDict[str, tuple[float, int]] = field(default_factory=OrderedDict)  # block id -> (time, seq)


class Replication:
    """Replication state and the applier thread of one replica."""

    def __init__(
        self,
        name: str,
        shard: str,
        engine_path: str,
        data_dir: Path,
        log_dir: Path,
        *,
        cluster_name: str = "lb_cluster",
        cluster_file: Path | None = None,
    ) -> None:
        self.name = name
        self.shard = shard
        self.cluster_name = cluster_name
        self.cluster_file = cluster_file
        self.log = ReplicationLog(log_dir)
        self._states_dir = log_dir / "replicas"
        self._states_dir.mkdir(parents=True, exist_ok=True)
        self._state_file = self._states_dir / f"{name}.json"
        self._catalog_file = data_dir / "replicated_tables.json"
        self._intents_dir = data_dir / "writes_in_progress"  # <write id>.json / .bin, one per write
        self._intents_dir.mkdir(exist_ok=True)
        self._inflight_file = data_dir / _inflight.FILE_NAME  # the engine insert being sent (see _inflight)
        self.catalog: dict[tuple[str, str], TableInfo] = {}
        if self._catalog_file.exists():
            for item in json.loads(self._catalog_file.read_text()):
                info = TableInfo(**item)
                self.catalog[(info.database, info.table)] = info
        self._pos = 0
        self._extra: set[int] = set()
        if self._state_file.exists():
            state = json.loads(self._state_file.read_text())
            self._pos, self._extra = int(state["pos"]), {int(s) for s in state["extra"]}
        self._paths: dict[str, _PathView] = {}
        self.delay = 0.0
        self.stopped = False
        self.crash_before_logging = False
        self.crash_in_batch = False
        self.crash_after_applying = False
        self._held = threading.Event()  # a write waits before it is logged (hold_before_logging)
        self._held.set()
        self.holding = False  # a write is waiting there now
        self.last_exception = ""
        self.last_queue_update = 0.0
        # Lock order: the log's locks, then _apply_lock, then _state_lock.
        self._apply_lock = threading.RLock()  # runs entries on the engine: the applier, clones, forced catch-up
        self._state_lock = threading.RLock()  # what this replica applied and its view of the log (short)
        self._local_writes: set[str] = set()  # write ids run here and being logged: never to be applied again
        self._duplicates: set[int] = set()  # inserts whose block id an earlier entry of their table logged
        # Inserts whose block id a later entry logged too (two replicas ran one block, a retry
        # while the first was still running): the later one's replica holds the block under its
        # own token, so these reach an engine alone, under that token, never in a batch.
        self._duplicated: set[int] = set()
        # Block ids of this replica's inserts running now (not yet logged): an entry with one of
        # them reaches the engine alone, under its own token (_may_batch).
        self._running_blocks: dict[str, int] = {}
        # Block ids this replica ran itself but another replica logged (a retry while this one
        # was down): their entries must reach the engine alone, under their own token.
        self._alone_file = data_dir / "apply_alone.json"
        self._apply_alone: set[str] = (
            set(json.loads(self._alone_file.read_text())) if self._alone_file.exists() else set()
        )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._conn = EngineConn(engine_path)
        # The engine's own defaults for replicated tables.
        windows = dict(
            line.split("\t")
            for line in self._conn.execute(
                "SELECT name, value FROM system.merge_tree_settings WHERE name IN "
                "('replicated_deduplication_window', 'replicated_deduplication_window_seconds')",
                "TSVRaw",
            )
            .body.decode()
            .splitlines()
        )
        self.dedup_window = int(windows.get("replicated_deduplication_window", 10000))
        self._dedup_default = self._conn.scalar("SELECT value FROM system.settings WHERE name = 'insert_deduplicate'")
        self.dedup_window_seconds = float(windows.get("replicated_deduplication_window_seconds", 3600))
        self._observed = 0
        self.log.refresh()
        self._observe_new()
        self._thread = threading.Thread(target=self._run, name="replication-applier", daemon=True)

    def start(self) -> None:
        self._finish_interrupted_apply()
        self._finish_interrupted_write()
        self._save_state()
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._conn.close()
        self.log.close()

    # -- control ---------------------------------------------------------------------------
    def control(self, change: dict[str, object] | None) -> dict[str, object]:
        """Read or change the replication faults: ``{"delay": seconds, "stopped": bool}``."""
        if change:
            if "delay" in change:
                self.delay = max(0.0, float(str(change["delay"])))
            if "stopped" in change:
                self.stopped = bool(change["stopped"])
            if "crash_before_logging" in change:
                self.crash_before_logging = bool(change["crash_before_logging"])
            if "crash_in_batch" in change:
                self.crash_in_batch = bool(change["crash_in_batch"])
            if "crash_after_applying" in change:
                self.crash_after_applying = bool(change["crash_after_applying"])
            if "hold_before_logging" in change:
                (self._held.clear if change["hold_before_logging"] else self._held.set)()
            self._wake.set()
        self.log.refresh()
        return {
            "delay": self.delay,
            "stopped": self.stopped,
            "crash_before_logging": self.crash_before_logging,
            "crash_in_batch": self.crash_in_batch,
            "crash_after_applying": self.crash_after_applying,
            "hold_before_logging": not self._held.is_set(),
            "holding": self.holding,
            "applied": self._pos,
            "log_end": self.log.last_seq,
            "queue": len(self._unapplied()),
        }

    # -- the hook the server calls ---------------------------------------------------------
    def execute(self, conn: EngineConn, sql: str, settings: dict[str, str], run: RunStatement) -> Result:
        """Run one statement, replicating it when it writes to a replicated table or cluster."""
        head = _INTERESTING.match(sql)
        if head is None:
            return run(sql)
        if head.group(1).upper() in ("SELECT", "WITH", "SHOW", "DESC", "DESCRIBE", "EXPLAIN", "(") and not (
            _SYSTEM_TABLE_HINT.search(sql)
        ):
            return run(sql)
        st = _sql.classify(sql)
        if st is None or st.kind == "select":
            spans = st.system_tables if st is not None else []
            if self.catalog and head.group(1).upper() in ("SELECT", "WITH", "EXPLAIN", "("):
                spans = spans + _sql.system_tables_spans(sql)
            return run(self._rewrite_system_tables(sql, spans)) if spans else run(sql)
        if st.cluster is not None:
            return self._on_cluster(conn, st, settings, run)
        if st.kind == "fetches":
            self.stopped = st.stop
            self._wake.set()
            return Result(b"")
        if st.kind == "sync_replica":
            return self._sync_replica(conn, st, {**settings, **_sql.inline_settings(sql)})
        if not self._concerns_replication(conn, st):
            return run(sql)
        if st.kind == "insert":
            result = self._insert_concurrently(conn, st, settings, run)
            if result is not None:
                return result
        with self.log.locked():
            return self._local(conn, st, settings, run, origin=True)

    def _insert_concurrently(
        self, conn: EngineConn, st: _sql.Statement, settings: dict[str, str], run: RunStatement
    ) -> Result | None:
        """An insert into a replicated table, under the log's lock held shared (beside other
        inserts); None when it must take the exclusive path instead."""
        assert st.table is not None
        with self.log.shared():
            self.log.refresh()  # every entry written under the exclusive lock before ours is in
            self._observe_new()
            info = self.catalog.get(st.table.resolve(conn.database))
            if info is None:
                return None  # dropped meanwhile: the exclusive path says what happens now
            with self._state_lock:
                view = self._paths.get(info.zookeeper_path, _PathView())
                queued = [self.log.entries[s - 1] for s in view.seqs if not self._is_applied(s)]
            if any(e.kind != "insert" for e in queued):
                return None  # an ALTER/DELETE of this table not applied here yet: apply it first
            return self._replicated_write(conn, st, info, settings, run)

    def _concerns_replication(self, conn: EngineConn, st: _sql.Statement) -> bool:
        if st.kind == "create_table":
            return st.engine is not None
        if st.kind == "create_database":
            return bool(_REPLICATED_DATABASE.search(st.sql))
        if st.kind == "drop_database":
            return any(k[0] == st.database for k in self.catalog)
        if st.kind == "rename":
            return any(old.resolve(conn.database) in self.catalog for old, _ in st.renames)
        if st.table is not None:
            return st.table.resolve(conn.database) in self.catalog
        return False

    # -- statement handling (the caller holds the log lock) ---------------------------------
    def _local(
        self,
        conn: EngineConn,
        st: _sql.Statement,
        settings: dict[str, str],
        run: RunStatement,
        *,
        origin: bool,
        uuid: str | None = None,
    ) -> Result:
        """Run ``st`` (its ON CLUSTER clause removed) here, with its replication side effects.

        ``origin``: the statement came from a client (table writes are logged); otherwise it is
        an ON CLUSTER entry being applied (only this replica's own bookkeeping is logged).
        """
        self._observe_new()
        sql = st.local_sql or st.sql
        key = st.table.resolve(conn.database) if st.table is not None else None
        info = self.catalog.get(key) if key is not None else None
        if st.kind == "create_table" and st.engine is not None:
            return self._create_replicated(conn, st, run, uuid)
        if st.kind == "create_database" and _REPLICATED_DATABASE.search(sql):
            raise ClickHouseError.make(
                48,
                "The Replicated database engine is not implemented by clickhouse_lb.testing's local cluster; "
                f"create ReplicatedMergeTree tables with ON CLUSTER {self.cluster_name} instead, "
                "or use DockerCluster",
            )
        if info is not None and st.kind in ("insert", "table_write") and origin:
            return self._replicated_write(conn, st, info, settings, run)
        result = run(sql)
        if st.kind == "drop_table" and info is not None and key is not None:
            self._forget(key)
        elif st.kind == "drop_database" and st.database is not None:
            for k in [k for k in self.catalog if k[0] == st.database]:
                self._forget(k)
        elif st.kind == "rename":
            for old, new in st.renames:
                old_key, new_key = old.resolve(conn.database), new.resolve(conn.database)
                moved = self.catalog.pop(old_key, None)
                if moved is not None:
                    moved.database, moved.table = new_key
                    self.catalog[new_key] = moved
            self._save_catalog()
        return result

    def _create_replicated(self, conn: EngineConn, st: _sql.Statement, run: RunStatement, uuid: str | None) -> Result:
        assert st.table is not None
        assert st.engine is not None
        database, table = st.table.resolve(conn.database)
        local_sql = _sql.replace_spans(
            st.local_sql or st.sql, [(st.engine.start, st.engine.end, st.engine.local_clause)]
        )
        target = _sql.qualified(database, table)
        if conn.scalar(f"EXISTS TABLE {target}") == "1":
            return run(local_sql)  # IF NOT EXISTS: nothing happens; otherwise the engine's error
        table_uuid = st.explicit_uuid or uuid or str(uuid_module.uuid4())
        macros = {"shard": self.shard, "replica": self.name, "uuid": table_uuid, "database": database, "table": table}
        try:
            path = _sql.expand_macros(st.engine.zookeeper_path or DEFAULT_ZOOKEEPER_PATH, macros)
            replica_name = _sql.expand_macros(st.engine.replica_name or DEFAULT_REPLICA_NAME, macros)
        except KeyError as exc:
            raise ClickHouseError.make(139, f"No macro '{exc.args[0]}' in config") from None
        path = path.rstrip("/") or "/"
        view = self._paths.get(path)
        if view is not None and replica_name in view.replicas:
            raise ClickHouseError.make(253, f"Replica {path}/replicas/{replica_name} already exists")
        result = run(local_sql)
        conn.execute(f"ALTER TABLE {target} MODIFY SETTING non_replicated_deduplication_window = {self.dedup_window}")
        info = TableInfo(
            database,
            table,
            st.engine.name,
            path,
            replica_name,
            table_uuid,
            st.engine.zookeeper_path or DEFAULT_ZOOKEEPER_PATH,
            st.engine.replica_name or DEFAULT_REPLICA_NAME,
        )
        with self._apply_lock:  # the applier must not see the new table before its history is in
            self.catalog[(database, table)] = info
            self._save_catalog()
            attach = self._append(
                {"kind": "attach", "path": path, "replica": replica_name, "host": self.name, "ts": time.time()}
            )
            history = [s for s in self._paths[path].seqs if s < attach.seq]
            for seq in history:  # clone: the table's history so far, in log order
                self._apply_to(self.log.entries[seq - 1], [info])
                self._mark_applied(seq)
        return result

    def _append(self, header: dict[str, Any], payload: bytes = b"") -> Entry:
        """Log an entry this replica has already applied. Its applier skips the entry between
        the append and the mark (a write is known by its id meanwhile; the other kinds it logs
        are only marked by the applier, or are held back by the lock their writer holds)."""
        write = header.get("write")
        if write is not None:
            with self._state_lock:
                self._local_writes.add(str(write))
        try:
            entry = self.log.append(header, payload)
            self._observe_new()
            self._mark_applied(entry.seq)
        finally:
            if write is not None:
                with self._state_lock:
                    self._local_writes.discard(str(write))
        return entry

    def _forget(self, key: tuple[str, str]) -> None:
        info = self.catalog.pop(key)
        self._save_catalog()
        self._append({"kind": "detach", "path": info.zookeeper_path, "replica": info.replica_name, "ts": time.time()})

    def _replicated_write(
        self, conn: EngineConn, st: _sql.Statement, info: TableInfo, settings: dict[str, str], run: RunStatement
    ) -> Result:
        assert st.table is not None
        sql = st.local_sql or st.sql
        path = info.zookeeper_path
        with self._state_lock:
            view = self._paths.setdefault(path, _PathView())
            queued = [s for s in view.seqs if not self._is_applied(s)]
        if st.kind != "insert" or any(self.log.entries[s - 1].kind != "insert" for s in queued):
            self._apply_pending(force=True)
        header: dict[str, Any] = {
            "kind": "insert" if st.kind == "insert" else "table",
            "path": path,
            "verb": st.verb,
            "rest": sql[st.table.end :],
            "settings": {k: v for k, v in settings.items() if not k.startswith("insert_dedup")},
            "origin": self.name,
            "ts": time.time(),
            "write": uuid_module.uuid4().hex,
        }
        block_id = self._block_id(conn, st, sql, settings, run) if st.kind == "insert" else None
        if block_id is not None and not self._start_block(view, block_id):
            log.info("insert into %s.%s deduplicated (block id %s)", info.database, info.table, block_id)
            return Result(b"")
        try:
            return self._run_and_log(conn, st, header, sql=sql, settings=settings, run=run, block_id=block_id)
        finally:
            if block_id is not None:
                self._end_block(block_id)

    def _start_block(self, view: _PathView, block_id: str) -> bool:
        """Whether an insert of ``block_id`` runs here (False: a duplicate); if so, its block
        counts as running until _end_block.

        Registered before the log is read again: an applier that sends an entry of this block
        in a batch after this either sees it running (and sends the entry alone) or has
        observed that entry before, which this check then sees."""
        with self._state_lock:
            self._running_blocks[block_id] = self._running_blocks.get(block_id, 0) + 1
        self.log.refresh()
        self._observe_new()
        with self._state_lock:
            if self._is_duplicate(view, block_id):
                self._end_block(block_id)
                return False
        return True

    def _end_block(self, block_id: str) -> None:
        with self._state_lock:
            left = self._running_blocks.pop(block_id) - 1
            if left:
                self._running_blocks[block_id] = left

    def _run_and_log(
        self,
        conn: EngineConn,
        st: _sql.Statement,
        header: dict[str, Any],
        *,
        sql: str,
        settings: dict[str, str],
        run: RunStatement,
        block_id: str | None,
    ) -> Result:
        assert st.table is not None
        payload = b""
        if st.kind == "insert":
            token = block_id if block_id is not None else f"clickhouse-lb-{header['write']}"
            header.update(block_id=block_id, token=token)
            payload = run.data
            header["format"] = run.format
            dedup = {"insert_deduplicate": "1", "insert_deduplication_token": token}
            inline = _sql.with_insert_settings(sql, st.table.end, dedup)
            if inline is not None:
                sql = inline
            else:
                conn.apply_settings({**settings, **dedup})
        write = str(header["write"])
        self._record_intent(write, header, payload)
        try:
            result = run(sql)
        except BaseException:
            self._clear_intent(write)
            raise
        if self.crash_before_logging:  # a fault for tests: the window a real crash can hit
            os.kill(os.getpid(), signal.SIGKILL)
        if not self._held.is_set():  # a fault for tests: a write slow to log (a retry races it)
            self.holding = True
            self._held.wait()
            self.holding = False
        self._append(header, payload)
        self._clear_intent(write)
        return result

    # -- a write killed between running here and being logged -------------------------------
    # ClickHouse commits an inserted part to Keeper or not at all: a part written on a server
    # killed before the commit is never seen. Here the write runs on the engine first and is
    # logged after, so a SIGKILL in between would leave it on this replica only. The write is
    # recorded as "in progress" before it runs; a replica restarted with such a record logs it
    # then (rolls it forward), so either every replica gets the write or, if this one is never
    # restarted, none does.
    def _record_intent(self, write: str, header: dict[str, Any], payload: bytes) -> None:
        (self._intents_dir / f"{write}.bin").write_bytes(payload)
        tmp = self._intents_dir / f"{write}.tmp"
        tmp.write_text(json.dumps(header))
        os.replace(tmp, self._intents_dir / f"{write}.json")  # the header last: its presence means the record is whole

    def _clear_intent(self, write: str) -> None:
        for suffix in (".json", ".bin"):  # the header first: a payload alone is no record
            with contextlib.suppress(FileNotFoundError):
                (self._intents_dir / f"{write}{suffix}").unlink()

    def _finish_interrupted_write(self) -> None:
        """Log the writes this replica was killed in the middle of, those not logged yet.

        An insert is applied here like any other entry, with its deduplication token: a no-op
        if its first run had committed. Another write (ALTER, DELETE, ...) is taken as run here:
        running it twice is not harmless in general (the one case where this replica may miss
        a write: killed while running it, before it committed).
        """
        for tmp in self._intents_dir.glob("*.tmp"):  # killed while recording: it never ran
            tmp.unlink()
        records = []
        for path in self._intents_dir.glob("*.json"):
            header = json.loads(path.read_text())
            payload_file = path.with_suffix(".bin")
            records.append((float(header["ts"]), header, payload_file.read_bytes() if payload_file.exists() else b""))
        for _, header, payload in sorted(records, key=lambda r: r[0]):  # concurrent ones commute
            self._roll_forward(header, payload)
        for path in self._intents_dir.glob("*.bin"):  # their headers were removed or never written
            path.unlink()

    def _roll_forward(self, header: dict[str, Any], payload: bytes) -> None:
        with self.log.locked():
            self._observe_new()
            logged = any(e.header.get("write") == header["write"] for e in reversed(self.log.entries))
            view = self._paths.get(str(header["path"]))
            block_id = header.get("block_id")
            duplicate = view is not None and block_id is not None and self._is_duplicate(view, str(block_id))
            if not logged and duplicate and block_id is not None:
                # Run here before the crash, logged by a retry elsewhere: this engine may hold
                # the block under its token, so that entry must reach it alone (_may_batch).
                self._apply_alone.add(str(block_id))
                self._save_apply_alone()
            if not logged and not duplicate:
                header["ts"] = time.time()
                header["rolled_forward"] = True  # applied alone: its first run may have committed (_batching)
                if header["kind"] == "insert":  # applied here by the applier, with its token
                    self.log.append(header, payload)
                    self._observe_new()
                else:
                    self._append(header, payload)  # taken as applied here
                log.warning("write %s, interrupted by this replica's end, logged at restart", header["write"])
        self._clear_intent(str(header["write"]))

    def _block_id(
        self, conn: EngineConn, st: _sql.Statement, sql: str, settings: dict[str, str], run: RunStatement
    ) -> str | None:
        inline = _sql.inline_settings(sql[:4096])  # written before the data
        if conn.set_by_client:  # a SET of the session's may have changed them: ask
            values = (
                conn.execute(
                    "SELECT getSetting('insert_deduplicate'), getSetting('insert_deduplication_token')", "TSVRaw"
                )
                .body.decode()
                .rstrip("\n")
                .split("\t")
            )
        else:  # only the request's settings are on the connection: no query needed
            values = [
                settings.get("insert_deduplicate", self._dedup_default),
                settings.get("insert_deduplication_token", ""),
            ]
        dedup = inline.get("insert_deduplicate", values[0])
        token = inline.get("insert_deduplication_token", values[1] if len(values) > 1 else "")
        if dedup.lower() in ("0", "false"):
            return None
        if token:
            return token
        assert st.table is not None
        if run.format is None and _sql.inserts_a_select(sql[st.table.end :]):
            return None  # the text does not identify the rows (the source may have changed)
        digest = hashlib.sha256(sql[st.table.end :].strip().encode())
        digest.update(b"\0" + str(run.format or "").encode() + b"\0")
        digest.update(run.data)
        return f"hash_{digest.hexdigest()}"

    def _is_duplicate(self, view: _PathView, block_id: str) -> bool:
        seen = view.blocks.get(block_id)
        return seen is not None and time.time() - seen[0] <= self.dedup_window_seconds

    def _on_cluster(self, conn: EngineConn, st: _sql.Statement, settings: dict[str, str], run: RunStatement) -> Result:
        if st.cluster != self.cluster_name:
            raise ClickHouseError.make(701, f"Requested cluster '{st.cluster}' not found")
        table_uuid = st.explicit_uuid or str(uuid_module.uuid4())
        with self.log.locked():
            self._apply_pending(force=True)
            result = self._local(conn, st, settings, run, origin=False, uuid=table_uuid)
            entry = self._append(
                {
                    "kind": "cluster",
                    "database": conn.database,
                    "sql": st.local_sql,
                    "uuid": table_uuid,
                    "settings": settings,
                    "origin": self.name,
                    "ts": time.time(),
                }
            )
        timeout = float({**settings, **_sql.inline_settings(st.sql)}.get("distributed_ddl_task_timeout") or 180)
        self._wait_for_active_replicas(entry.seq, timeout)
        return result

    def _wait_for_active_replicas(self, seq: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting: list[str] = []
        while True:
            waiting = []
            for path in self._states_dir.glob("*.json"):
                state = _read_state(path)
                if state is None or path.stem == self.name:
                    continue
                if time.time() - state["mtime"] > ACTIVE_WITHIN:
                    continue  # killed or paused: it runs the entry when it returns
                if not (state["pos"] >= seq or seq in state["extra"]):
                    waiting.append(path.stem)
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ClickHouseError.make(
                    159,
                    f"Distributed DDL task (log entry {seq}) is not finished on {len(waiting)} of the cluster's hosts "
                    f"({', '.join(sorted(waiting))}) after {timeout:g} s (distributed_ddl_task_timeout)",
                )
            time.sleep(_POLL)

    def _sync_replica(self, conn: EngineConn, st: _sql.Statement, settings: dict[str, str]) -> Result:
        assert st.table is not None
        database, table = st.table.resolve(conn.database)
        info = self.catalog.get((database, table))
        if info is None:
            if conn.scalar(f"EXISTS TABLE {_sql.qualified(database, table)}") != "1":
                raise ClickHouseError.make(60, f"Table {database}.{table} does not exist")
            raise ClickHouseError.make(36, f"Table {database}.{table} is not replicated")
        self.log.refresh()
        self._observe_new()
        target = self.log.last_seq
        view = self._paths.get(info.zookeeper_path, _PathView())
        wanted = [s for s in view.seqs if s <= target]
        timeout = float(settings.get("receive_timeout") or 300)
        deadline = time.monotonic() + timeout
        self._wake.set()
        while not all(self._is_applied(s) for s in wanted):
            if time.monotonic() > deadline:
                raise ClickHouseError.make(
                    159, f"SYNC REPLICA {database}.{table}: command timed out after {timeout:g} s"
                )
            time.sleep(_POLL)
        return Result(b"")

    # -- system tables ---------------------------------------------------------------------
    def _rewrite_system_tables(self, sql: str, found: list[tuple[int, int, str]]) -> str:
        """``system.replicas`` / ``system.clusters`` become a subquery of literals (no table
        function, so it also works with ``readonly = 1``); ``system.tables`` a subquery of the
        engine's own with the replicated tables' engines."""
        spans = []
        for start, end, name in sorted(found):
            if name == "tables":
                table = _system_tables.tables_view(list(self.catalog.values()))
            elif name == "replicas":
                table = _sql.literal_table(_system_tables.REPLICAS_COLUMNS, self._replicas_rows())
            else:
                table = _sql.literal_table(_system_tables.CLUSTERS_COLUMNS, self._clusters_rows())
            spans.append((start, end, table))
        return _sql.replace_spans(sql, spans)

    def _clusters_rows(self) -> list[dict[str, object]]:
        return _system_tables.clusters_rows(self.cluster_name, self.shard, self.name, self.cluster_file)

    def _replicas_rows(self) -> list[dict[str, object]]:
        self.log.refresh()
        self._observe_new()
        now = time.time()
        active = _active_replicas(self._states_dir)
        rows: list[dict[str, object]] = []
        for info in self.catalog.values():
            view = self._paths.get(info.zookeeper_path, _PathView())
            queue = [self.log.entries[s - 1] for s in view.seqs if not self._is_applied(s)]
            queue = [e for e in queue if e.kind in ("insert", "table")]
            oldest = min((float(e.header["ts"]) for e in queue), default=0.0)
            inserts = [e for e in queue if e.kind == "insert"]
            rows.append(
                {
                    "database": info.database,
                    "table": info.table,
                    "uuid": info.uuid,
                    "engine": info.engine,
                    "is_leader": 1,
                    "can_become_leader": 1,
                    "is_readonly": 0,
                    "is_session_expired": 0,
                    "future_parts": 0,
                    "parts_to_check": 0,
                    "zookeeper_name": "default",
                    "zookeeper_path": info.zookeeper_path,
                    "replica_name": info.replica_name,
                    "replica_path": f"{info.zookeeper_path}/replicas/{info.replica_name}",
                    "columns_version": -1,
                    "queue_size": len(queue),
                    "inserts_in_queue": len(inserts),
                    "merges_in_queue": 0,
                    "part_mutations_in_queue": len(queue) - len(inserts),
                    "queue_oldest_time": _timestamp(oldest),
                    "inserts_oldest_time": _timestamp(min((float(e.header["ts"]) for e in inserts), default=0.0)),
                    "merges_oldest_time": _timestamp(0.0),
                    "part_mutations_oldest_time": _timestamp(
                        min((float(e.header["ts"]) for e in queue if e.kind == "table"), default=0.0)
                    ),
                    "log_max_index": len(view.seqs),
                    "log_pointer": sum(1 for s in view.seqs if self._is_applied(s)),
                    "last_queue_update": _timestamp(self.last_queue_update),
                    "absolute_delay": int(now - oldest) if queue else 0,
                    "total_replicas": len(view.replicas),
                    "active_replicas": sum(1 for r in view.replicas if view.hosts.get(r, r) in active),
                    "lost_part_count": 0,
                    "last_queue_update_exception": self.last_exception,
                    "replica_is_active": {r: int(view.hosts.get(r, r) in active) for r in sorted(view.replicas)},
                }
            )
        return rows

    # -- the log, seen from this replica ---------------------------------------------------
    def _observe_new(self) -> None:
        """Take the log entries read since the last call into this replica's view."""
        with self._state_lock:
            self._observe(self.log.entries[self._observed :])

    def _observe(self, entries: list[Entry]) -> None:
        for entry in entries:
            if entry.seq <= self._observed:
                continue
            self._observed = entry.seq
            header = entry.header
            path = header.get("path")
            if path is None:
                continue
            view = self._paths.setdefault(str(path), _PathView())
            if entry.kind == "attach":
                view.replicas.add(str(header["replica"]))
                view.hosts[str(header["replica"])] = str(header.get("host", header["replica"]))
            elif entry.kind == "detach":
                view.replicas.discard(str(header["replica"]))
                if not view.replicas:  # the last replica left: Keeper's path is gone
                    del self._paths[str(path)]
                continue
            elif entry.kind == "insert" and header.get("block_id"):
                seen = view.blocks.get(str(header["block_id"]))
                if seen is not None and float(header["ts"]) - seen[0] <= self.dedup_window_seconds:
                    self._duplicates.add(entry.seq)
                    self._duplicated.add(seen[1])
                view.blocks[str(header["block_id"])] = (float(header["ts"]), entry.seq)
                view.blocks.move_to_end(str(header["block_id"]))
                while len(view.blocks) > self.dedup_window:
                    view.blocks.popitem(last=False)
            view.seqs.append(entry.seq)

    def _is_applied(self, seq: int) -> bool:
        return seq <= self._pos or seq in self._extra

    def _mark_applied(self, seq: int) -> None:
        with self._state_lock:
            self._extra.add(seq)
            while self._pos + 1 in self._extra:
                self._pos += 1
                self._extra.discard(self._pos)
            self.last_queue_update = time.time()
            self._save_state()

    def _unapplied(self) -> list[int]:
        return [s for s in range(self._pos + 1, self.log.last_seq + 1) if s not in self._extra]

    def _save_state(self) -> None:
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pos": self._pos, "extra": sorted(self._extra)}))
        os.replace(tmp, self._state_file)

    def _save_catalog(self) -> None:
        tmp = self._catalog_file.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(i) for i in self.catalog.values()]))
        os.replace(tmp, self._catalog_file)

    # -- applying --------------------------------------------------------------------------
    def _run(self) -> None:
        last_beat = 0.0
        while not self._stop.is_set():
            try:
                self.log.refresh()
                self._observe_new()
                if any(self.log.entries[s - 1].kind == "cluster" for s in self._unapplied()):
                    with self.log.locked():  # lock order: the log, then the applier
                        self._apply_pending(force=False)
                else:
                    self._apply_pending(force=False)
            except Exception:  # keep replicating; the error is in the log and system.replicas
                log.exception("replication applier")
            now = time.monotonic()
            if now - last_beat > _HEARTBEAT:
                last_beat = now
                with contextlib.suppress(OSError):
                    os.utime(self._state_file)
            self._wake.wait(_POLL)
            self._wake.clear()

    def _apply_pending(self, force: bool) -> None:
        """Apply unapplied entries in log order: all of them (``force``) or those due."""
        with self._apply_lock:
            self._observe_new()
            blocked = False
            now = time.time()

            def due(entry: Entry) -> bool:
                return force or (not self.stopped and now - float(entry.header["ts"]) >= self.delay)

            # Only entries observed: an entry read into the log since (by another thread) may
            # duplicate a block in this round, which only observing it tells.
            pending = [s for s in self._unapplied() if s <= self._observed]
            for index, seq in enumerate(pending):
                entry = self.log.entries[seq - 1]
                with self._state_lock:
                    # A write of this replica, logged since _unapplied() or being logged now:
                    # it ran here already (its writer marks it applied).
                    if self._is_applied(seq) or entry.header.get("write") in self._local_writes:
                        continue
                if entry.kind in ("attach", "detach"):
                    self._mark_applied(seq)
                elif entry.kind == "cluster":
                    if not self.log.held:
                        break  # taken with the log lock first, on the next round
                    self._apply_cluster(entry)
                    self._mark_applied(seq)
                elif not blocked and due(entry) and seq in self._duplicates:
                    # Its block came with the earlier entry (ClickHouse writes it once): its
                    # own replica ran it, and no other may (that one may have been in a batch).
                    self._mark_applied(seq)
                elif not blocked and due(entry):
                    infos = [i for i in self.catalog.values() if i.zookeeper_path == entry.header["path"]]
                    batch = self._batch(entry, pending[index + 1 :], due) if infos else [entry]
                    self._apply_entries(batch, infos)
                    if len(batch) == 1:
                        self._applied_alone(entry)  # after the mark: until then it may be sent again
                else:
                    blocked = True  # keep the table entries' order: nothing after this one either

    def _batch(self, first: Entry, following: list[int], due: Callable[[Entry], bool]) -> list[Entry]:
        """``first`` and the inserts after it that can go to the engine with it (see _batching)."""
        fmt = str(first.header.get("format") or "")
        if not self._may_batch(first):
            return [first]
        binary = fmt.lower() in _batching.BINARY
        batch, size = [first], first.payload_length
        last_joinable = binary or _batching.joinable(fmt, self.log.payload(first))
        for seq in following:
            entry = self.log.entries[seq - 1]
            if entry.kind == "cluster" or not due(entry):
                break  # the round stops there
            if entry.header.get("path") != first.header["path"]:
                continue  # another table: applied in its turn
            with self._state_lock:
                if self._is_applied(seq) or entry.header.get("write") in self._local_writes:
                    continue  # ran here already
            if (
                not last_joinable
                or not self._may_batch(entry)
                or not _batching.same_statement(first.header, entry.header)
                or len(batch) >= _batching.MAX_ENTRIES
                or size + entry.payload_length > _batching.MAX_BYTES
            ):
                break  # keep this table's entries in log order: the batch ends before this one
            batch.append(entry)
            size += entry.payload_length
            last_joinable = binary or _batching.joinable(fmt, self.log.payload(entry))
        return batch

    def _may_batch(self, entry: Entry) -> bool:
        """Whether ``entry`` may reach the engine under a batch's token rather than its own: not
        if this replica's engine may hold its block under its own token already (this replica
        wrote it: unapplied only after a crash between logging and marking it; or ran it before
        a crash while a retry elsewhere logged it; or is running it now), nor if another entry
        logged its block too (whose replica holds it under its own token)."""
        block_id = str(entry.header.get("block_id"))
        with self._state_lock:  # against _start_block: see there
            return (
                entry.seq not in self._duplicates
                and entry.seq not in self._duplicated
                and entry.header.get("origin") != self.name
                and block_id not in self._apply_alone
                and block_id not in self._running_blocks
                and _batching.batchable(entry.header, entry.payload_length)
            )

    def _applied_alone(self, entry: Entry) -> None:
        block_id = str(entry.header.get("block_id"))
        if block_id in self._apply_alone:
            self._apply_alone.discard(block_id)
            self._save_apply_alone()

    def _save_apply_alone(self) -> None:
        tmp = self._alone_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(self._apply_alone)))
        os.replace(tmp, self._alone_file)

    def _apply_entries(self, batch: list[Entry], infos: list[TableInfo]) -> None:
        """Send ``batch`` (one entry, or inserts joined, see _batch) to the engine and record its
        entries applied. It is recorded in flight first (see _inflight): a replica killed before
        the marks sends exactly that insert again at restart, under the same token, which the
        engine drops if it had committed; a mutation only where it had not run."""
        first = batch[0]
        joined = len(batch) > 1
        token = _batching.token([str(e.header["token"]) for e in batch]) if joined else None
        if first.kind == "insert" and infos:
            flight = _inflight.InFlight(tuple(e.seq for e in batch), token or str(first.header["token"]))
            _inflight.record(self._inflight_file, flight)
        elif first.kind == "table" and infos:
            mutations = {_table_key(i): self._newest_mutation(i) for i in infos}
            _inflight.record(self._inflight_file, _inflight.InFlight((first.seq,), mutations=mutations))
        if joined:
            self._apply_to(first, infos, token=token, payload=b"".join(self.log.payload(e) for e in batch))
        else:
            self._apply_to(first, infos)
        # Faults for tests: in the engine, not yet recorded as applied.
        if (self.crash_in_batch and joined) or (self.crash_after_applying and not joined and infos):
            os.kill(os.getpid(), signal.SIGKILL)
        for member in batch:
            self._mark_applied(member.seq)

    def _finish_interrupted_apply(self) -> None:
        """Send the engine insert this replica was killed in the middle of again, the same
        entries under the same token (see _apply_entries), before anything else is applied; a
        non-insert entry to the tables where it left no mutation."""
        flight = _inflight.read(self._inflight_file)
        if flight is None:
            return
        seqs = list(flight.seqs)
        if not all(self._is_applied(s) for s in seqs) and all(s <= self.log.last_seq for s in seqs):
            batch = [self.log.entries[s - 1] for s in seqs]
            infos = [i for i in self.catalog.values() if i.zookeeper_path == batch[0].header["path"]]
            targets = len(infos)
            if batch[0].kind == "table":
                infos = [i for i in infos if not flight.ran_on(_table_key(i), self._newest_mutation(i))]
            payload = b"".join(self.log.payload(e) for e in batch)
            with self._apply_lock:
                self._apply_to(batch[0], infos, token=flight.token or None, payload=payload)
                for seq in seqs:
                    self._mark_applied(seq)
            log.warning(
                "entries %s, interrupted by this replica's end, sent to the engine again (%d of %d tables)",
                seqs,
                len(infos),
                targets,
            )
        _inflight.clear(self._inflight_file)

    def _newest_mutation(self, info: TableInfo) -> int:
        """The number of the newest mutation of ``info``'s local table (0: none yet)."""
        newest = self._conn.scalar(
            "SELECT max(toUInt64OrZero(extract(mutation_id, '([0-9]+)'))) FROM system.mutations "
            f"WHERE database = {_sql.sql_string(info.database)} AND table = {_sql.sql_string(info.table)}"
        )
        return int(newest or 0)

    def _apply_to(
        self, entry: Entry, infos: list[TableInfo], *, token: str | None = None, payload: bytes | None = None
    ) -> None:
        """Apply ``entry`` to ``infos``; an insert with ``token``/``payload`` instead of its own
        (a batch, see _apply_entries)."""
        header = entry.header
        if entry.kind not in ("insert", "table"):
            return
        for info in infos:
            target = _sql.qualified(info.database, info.table)
            settings = dict(header.get("settings") or {})
            try:
                if entry.kind == "insert":
                    dedup = {"insert_deduplicate": "1", "insert_deduplication_token": token or str(header["token"])}
                    statement = f"INSERT INTO {target}{header['rest']}"
                    inline = _sql.with_insert_settings(statement, len(f"INSERT INTO {target}"), dedup)
                    if inline is not None:
                        statement = inline  # the connection's settings stay those of the previous entry
                    else:
                        settings.update(dedup)
                    self._conn.apply_settings(settings)
                    if header.get("format"):
                        data = payload if payload is not None else self.log.payload(entry)
                        self._conn.insert(statement, str(header["format"]), data)
                    else:
                        self._conn.execute(statement)
                else:
                    self._conn.apply_settings(settings)
                    self._conn.execute(f"{header['verb']} {target}{header['rest']}")
            except ClickHouseError as exc:
                self.last_exception = exc.text
                log.warning("replication entry %s on %s failed: %s", entry.seq, target, exc.text)
            # The settings stay until the next entry's replace them (apply_settings only sends
            # what differs): reverting them after each entry cost two more queries per insert.

    def _apply_cluster(self, entry: Entry) -> None:
        header = entry.header
        st = _sql.classify(str(header["sql"]))
        conn = self._conn
        try:
            conn.apply_settings({})
            conn.use(str(header["database"]))

            def run(sql: str) -> Result:
                return conn.execute(sql)

            if st is None:
                conn.execute(str(header["sql"]))
            else:
                self._local(conn, st, {}, RunStatement(run), origin=False, uuid=str(header.get("uuid") or ""))
        except ClickHouseError as exc:
            self.last_exception = exc.text
            log.warning("ON CLUSTER entry %s failed here: %s", entry.seq, exc.text)
        finally:
            with contextlib.suppress(ClickHouseError):
                conn.use("default")


def _table_key(info: TableInfo) -> str:
    return f"{info.database}.{info.table}"


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(path.read_text())
        state["mtime"] = path.stat().st_mtime
        state["extra"] = set(state["extra"])
        return dict(state)
    except (OSError, ValueError, KeyError):
        return None


def _active_replicas(states_dir: Path) -> set[str]:
    now = time.time()
    out: set[str] = set()
    for path in states_dir.glob("*.json"):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime <= ACTIVE_WITHIN:
                out.add(path.stem)
    return out


def _timestamp(ts: float) -> int:
    return max(0, int(ts))
