"""Chaos (issue 13): 8 threads of mixed reads and writes while replicas are killed, paused
(SIGSTOP) and restarted at random, at least one replica always up.

Asserted: no read fails; every failed write says whether it may have been applied (and one
that says "not applied" is indeed absent); every acknowledged insert is present afterwards --
exactly once when the cluster replicates (ReplicatedMergeTree), else at least once on some
replica (without replication a retried insert may land on two replicas; with it, the
deduplication token makes the retry a no-op).

Bounded: ``CLICKHOUSE_LB_CHAOS_SECONDS`` of chaos (default 20 s, which the default run
includes; 60 s for a long run). The ``chaos`` marker selects it alone:
``CLICKHOUSE_LB_CHAOS_SECONDS=60 pytest -m chaos integration/test_chaos.py``.

It found one defect of the local cluster: a write SIGKILLed after it ran on a replica's engine
and before it was logged stayed on that replica only (now rolled forward at restart; the
deterministic test is in test_replication.py, ``crash_before_logging``). A failure prints each
diverging row, what its writer was told and the replicas' replication log lines.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from clickhouse_lb import get_pool
from clickhouse_lb.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SECONDS = float(os.environ.get("CLICKHOUSE_LB_CHAOS_SECONDS", "20"))
THREADS = 8


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    reads: int = 0
    failed_reads: list[str] = field(default_factory=list)
    acknowledged: list[int] = field(default_factory=list)
    not_applied: list[int] = field(default_factory=list)
    maybe_applied: list[int] = field(default_factory=list)
    unlabelled: list[str] = field(default_factory=list)


@pytest.fixture
def chaos_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(replicas=3) as cluster:
        yield cluster


def _replicated(cluster: LocalCluster) -> bool:
    """Whether this cluster replicates: a ReplicatedMergeTree table can be created on it."""
    try:
        cluster.on_all(
            "CREATE TABLE chaos (id UInt64, how String) ENGINE = "
            "ReplicatedMergeTree('/clickhouse/tables/chaos', '{replica}') ORDER BY id"
        )
    except Exception:
        cluster.on_all("DROP TABLE IF EXISTS chaos")
        cluster.on_all("CREATE TABLE chaos (id UInt64, how String) ENGINE = MergeTree ORDER BY id")
        return False
    return True


def _monkey(cluster: LocalCluster, stop: threading.Event, rng: random.Random) -> None:
    """Kill, pause or restart a random replica every 0.3-1 s, never taking the last one down."""
    n = len(cluster)
    while not stop.wait(rng.uniform(0.3, 1.0)):
        down = [i for i in range(n) if not cluster.is_alive(i) or cluster.is_paused(i)]
        up = [i for i in range(n) if i not in down]
        if down and (len(up) == 1 or rng.random() < 0.5):
            i = rng.choice(down)
            if cluster.is_paused(i) and rng.random() < 0.5:
                cluster.resume(i)
            else:
                cluster.restart(i)
        elif len(up) > 1:
            i = rng.choice(up)
            (cluster.kill if rng.random() < 0.5 else cluster.pause)(i)


def _worker(pool: object, number: int, stop: threading.Event, tally: Tally) -> None:
    rng = random.Random(number)
    sequence = 0
    while not stop.is_set():
        if rng.random() < 0.5:
            try:
                pool.query("SELECT count() FROM chaos")  # type: ignore[attr-defined]
                with tally.lock:
                    tally.reads += 1
            except Exception as exc:
                with tally.lock:
                    tally.failed_reads.append(f"{type(exc).__name__}: {exc}")
            continue
        sequence += 1
        row_id = number * 1_000_000 + sequence
        try:
            if rng.random() < 0.5:  # an insert: repeatable (deduplication token added by the pool)
                pool.insert("chaos", [[row_id, "insert"]], column_names=["id", "how"])  # type: ignore[attr-defined]
            else:  # a command: not repeatable once sent
                pool.command(f"INSERT INTO chaos VALUES ({row_id}, 'command')")  # type: ignore[attr-defined]
        except Exception as exc:
            applied = getattr(exc, "may_have_been_applied", None)
            with tally.lock:
                if applied is True:
                    tally.maybe_applied.append(row_id)
                elif applied is False:
                    tally.not_applied.append(row_id)
                else:
                    tally.unlabelled.append(f"{type(exc).__name__}: {exc}")
        else:
            with tally.lock:
                tally.acknowledged.append(row_id)


def test_chaos_mixed_reads_and_writes(chaos_cluster: LocalCluster) -> None:
    cluster = chaos_cluster
    replicated = _replicated(cluster)
    pool = get_pool(
        hosts=cluster.hosts,
        share_state=False,
        load_balancing="random",
        connect_timeout_with_failover_ms=300,
        send_receive_timeout=3,  # a paused replica costs 3 s to the statement that meets it
        connections_with_failover_max_tries=20,
        failover_backoff_ms=200,
        distributed_replica_error_half_life=5,
        failover_timeout=30,  # no statement outlives the chaos by much, whatever it meets
    )
    stop = threading.Event()
    tally = Tally()
    monkey = threading.Thread(target=_monkey, args=(cluster, stop, random.Random(13)), name="monkey")
    workers = [threading.Thread(target=_worker, args=(pool, n, stop, tally)) for n in range(THREADS)]
    for thread in (monkey, *workers):
        thread.start()
    time.sleep(SECONDS)  # the test's duration, not a synchronisation
    stop.set()
    for thread in (monkey, *workers):
        thread.join(timeout=90)  # a restart waits up to 60 s for a replica; a statement 30 s
        assert not thread.is_alive(), f"{thread.name} hung"
    cluster.heal()
    pool.close()
    print(  # the figures, for a run with -s
        f"chaos {SECONDS:.0f}s replicated={replicated}: {tally.reads} reads ({len(tally.failed_reads)} failed), "
        f"{len(tally.acknowledged)} writes acknowledged, {len(tally.maybe_applied)} failed saying 'may have been "
        f"applied', {len(tally.not_applied)} failed saying 'not applied'"
    )

    assert tally.reads > 0
    assert tally.acknowledged
    assert tally.failed_reads == []
    assert tally.unlabelled == []  # every failed write says whether it may have been applied
    if replicated:
        per_replica = _converged(cluster)
        counts = per_replica[0]
        diverged = sorted({k for c in per_replica for k in c if any(c2.get(k) != c.get(k) for c2 in per_replica)})
        assert not diverged, _explain(cluster, tally, per_replica, diverged)
        assert all(counts.get(row_id) == 1 for row_id in tally.acknowledged)  # exactly once
    else:
        counts = _counts(cluster, 0, 1, 2)
        assert all(counts.get(row_id, 0) >= 1 for row_id in tally.acknowledged)
    assert not any(counts.get(row_id) for row_id in tally.not_applied)


def _converged(cluster: LocalCluster, within: float = 30.0) -> list[dict[int, int]]:
    """Each replica's rows once replication has converged (or ``within`` seconds ran out).

    One SYSTEM SYNC REPLICA round is not enough: a write abandoned on a paused replica (the pool
    stopped waiting, the request was already in the replica's socket) is applied when the
    replica resumes at heal(), possibly after another replica's SYNC returned; the next round
    fetches it. Rows that never arrive still fail the comparison."""
    deadline = time.monotonic() + within
    while True:
        cluster.on_all("SYSTEM SYNC REPLICA chaos")  # blocks until each replica's queue is done
        per_replica = [_counts(cluster, i) for i in range(len(cluster))]
        if all(counts == per_replica[0] for counts in per_replica) or time.monotonic() > deadline:
            return per_replica


def _counts(cluster: LocalCluster, *replicas: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    for i in replicas:
        for line in cluster.query(i, "SELECT id, count() FROM chaos GROUP BY id FORMAT TSV").splitlines():
            row_id, count = line.split("\t")
            counts[int(row_id)] = counts.get(int(row_id), 0) + int(count)
    return counts


def _explain(cluster: LocalCluster, tally: Tally, per_replica: list[dict[int, int]], rows: list[int]) -> str:
    """What a failing comparison needs to be understood: each diverging row's count per replica,
    what its writer was told, and the replicas' replication warnings."""
    lines = []
    for row_id in rows[:10]:
        told = (
            "acknowledged"
            if row_id in tally.acknowledged
            else "may have been applied"
            if row_id in tally.maybe_applied
            else "not applied"
            if row_id in tally.not_applied
            else "unknown"
        )
        lines.append(f"row {row_id}: per replica {[c.get(row_id, 0) for c in per_replica]}, writer told {told}")
    for i in range(len(cluster)):
        text = cluster.log_path(i).read_text(errors="replace")
        lines += [f"replica {i}: {line}" for line in text.splitlines() if "replication" in line.lower()][-10:]
    return "\n".join(lines)
