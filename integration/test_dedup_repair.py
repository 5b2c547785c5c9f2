"""The replica's startup repair of the engine's deduplication log (clickhouse_lb.testing._dedup_repair),
on the real engine: a block id recorded for a part that never reached the disk (a SIGKILL inside
the insert's commit) must not make the engine drop the block when the write is applied again."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clickhouse_lb.testing._dedup_repair import drop_uncommitted_records

pytest.importorskip("chdb")
pytestmark = pytest.mark.integration

TABLE = "CREATE TABLE t (id UInt64) ENGINE = MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 100"


def _engine(path: Path, *statements: str) -> str:
    """Run statements on an engine over ``path`` in a process of its own (one engine per process)."""
    script = (
        "import sys\nfrom chdb import session\ns = session.Session(sys.argv[1])\nout = ''\n"
        "for q in sys.argv[2:]:\n    out = str(s.query(q, 'TSV'))\ns.close()\nprint(out, end='')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path), *statements], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _insert(row: int, token: str) -> str:
    return f"INSERT INTO t SETTINGS insert_deduplication_token = '{token}' VALUES ({row})"


def _lose_part_of_row_2(path: Path) -> None:
    """What a SIGKILL between the block id's record and the part's commit leaves: the record of
    row 2's block, no part."""
    _engine(path, TABLE, _insert(1, "a"), _insert(2, "b"))
    (part,) = list(path.glob("store/*/*/all_2_2_0"))
    shutil.rmtree(part)


def test_without_the_repair_the_engine_drops_the_block_as_a_duplicate(tmp_path: Path) -> None:
    _lose_part_of_row_2(tmp_path)
    assert _engine(tmp_path, _insert(2, "b"), "SELECT groupArray(id) FROM (SELECT id FROM t ORDER BY id)") == "[1]"


def test_the_repair_drops_the_record_of_the_missing_part_only(tmp_path: Path) -> None:
    _lose_part_of_row_2(tmp_path)
    removed = drop_uncommitted_records(tmp_path)
    assert [line.split("\t")[1] for line in removed] == ["all_2_2_0"]
    assert drop_uncommitted_records(tmp_path) == []  # nothing left to repair
    # The write applied again lands; the committed block's id still deduplicates.
    rows = _engine(
        tmp_path, _insert(2, "b"), _insert(1, "a"), "SELECT groupArray(id) FROM (SELECT id FROM t ORDER BY id)"
    )
    assert rows == "[1,2]"


def test_parts_merged_together_still_cover_their_blocks(tmp_path: Path) -> None:
    _engine(tmp_path, TABLE, _insert(1, "a"), _insert(2, "b"), "OPTIMIZE TABLE t FINAL")
    for merged in [*tmp_path.glob("store/*/*/all_1_1_0"), *tmp_path.glob("store/*/*/all_2_2_0")]:
        shutil.rmtree(merged)  # the source parts, once the engine has cleaned them up
    assert [p.name for p in tmp_path.glob("store/*/*/all_*")] == ["all_1_2_1"]
    assert drop_uncommitted_records(tmp_path) == []
    assert _engine(tmp_path, _insert(2, "b"), "SELECT count() FROM t") == "2"
