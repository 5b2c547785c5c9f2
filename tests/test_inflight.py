"""The applier's in-flight record: what was recorded last is what a restarted replica reads."""

from __future__ import annotations

from pathlib import Path

from clickhouse_lb.testing import _inflight
from clickhouse_lb.testing._inflight import InFlight


def test_the_last_recorded_insert_is_read_back_whole(tmp_path: Path) -> None:
    path = tmp_path / _inflight.FILE_NAME
    _inflight.record(path, InFlight((7,), "hash_abc"))
    _inflight.record(path, InFlight((9, 10, 12), "clickhouse-lb-batch-def"))
    assert _inflight.read(path) == InFlight((9, 10, 12), "clickhouse-lb-batch-def")
    assert [p.name for p in tmp_path.iterdir()] == [_inflight.FILE_NAME]  # no temporary left


def test_nothing_recorded_or_cleared_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / _inflight.FILE_NAME
    assert _inflight.read(path) is None
    _inflight.record(path, InFlight((1,), "t"))
    _inflight.clear(path)
    assert _inflight.read(path) is None
    _inflight.clear(path)  # clearing twice (a restart after a clean one) is no error


def test_a_record_written_before_single_entries_were_recorded_still_reads(tmp_path: Path) -> None:
    # The file name and format of the batch-only record: a data directory from before reads.
    path = tmp_path / "batch_in_progress.json"
    path.write_text('{"seqs": [3, 4], "token": "clickhouse-lb-batch-x"}')
    assert _inflight.read(path) == InFlight((3, 4), "clickhouse-lb-batch-x")


def test_a_non_insert_entry_ran_on_a_table_only_if_a_newer_mutation_is_there(tmp_path: Path) -> None:
    path = tmp_path / _inflight.FILE_NAME
    _inflight.record(path, InFlight((5,), mutations={"default.a": 3, "default.b": 0}))
    flight = _inflight.read(path)
    assert flight is not None
    assert flight == InFlight((5,), "", {"default.a": 3, "default.b": 0})
    assert flight.ran_on("default.a", 4)  # the UPDATE's mutation is on disk: not to be sent again
    assert not flight.ran_on("default.a", 3)
    assert not flight.ran_on("default.b", 0)
    assert not flight.ran_on("default.c", 9)  # not a target when it was sent: nothing known
