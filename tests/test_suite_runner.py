"""tools/run_clickhouse_connect_suite.py's comparison (the suite itself is not part of this
repository, so CI checks what the runner concludes from two runs' reports and logs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "run_clickhouse_connect_suite.py"


@pytest.fixture(scope="module")
def runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_clickhouse_connect_suite", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def junit(path: Path, cases: str) -> Path:
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return path


def test_outcomes_count_a_teardown_failure_as_failed(runner: ModuleType, tmp_path: Path) -> None:
    report = junit(tmp_path / "pool.xml", """
        <testcase classname="t.test_a" name="test_ok"/>
        <testcase classname="t.test_a" name="test_bad"><failure message="assert 6 == 3&#10;more">x</failure></testcase>
        <testcase classname="t.test_a" name="test_skip"><skipped message="cloud only"/></testcase>
        <testcase classname="t.test_a" name="test_teardown"/>
        <testcase classname="t.test_a" name="test_teardown"><error message="teardown broke"/></testcase>
    """)
    assert runner.outcomes(report) == {
        "t.test_a::test_ok": ("passed", ""),
        "t.test_a::test_bad": ("failed", "assert 6 == 3"),
        "t.test_a::test_skip": ("skipped", ""),
        "t.test_a::test_teardown": ("failed", "teardown broke"),
    }


def test_the_comparison_states_the_share_and_each_runs_unraisable_lines(runner: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "pool.log"
    log.write_text("Exception ignored in: 'x.__dealloc__'\nINTERNALERROR> a\nINTERNALERROR> b\n")
    assert runner.log_findings(log) == (1, 2)
    assert runner.log_findings(tmp_path / "missing.log") == (0, 0)
    plain = {f"t::test_{i}": ("passed", "") for i in range(50)}
    pool = {**plain, "t::test_0": ("failed", "assert 6 == 3")}
    text = runner.compare(plain, pool, {"plain": 60.0, "pool": 90.0}, {"plain": (0, 0), "pool": (1, 2)})
    assert "| plain clients | 50 | 0 | 0 | 0 | 0 | 1.0 |" in text
    assert "| get_pool, 3 replicas, in_order | 49 | 1 | 0 | 1 | 2 | 1.5 |" in text
    assert "the pool passes 49 (98.0%)" in text
    assert "- `t::test_0` (pool: failed) assert 6 == 3" in text


def test_the_runner_fails_when_the_pooled_run_left_an_unraisable_or_an_internal_error(runner: ModuleType) -> None:
    assert runner.exit_status((0, 0)) == 0
    assert runner.exit_status((1, 0)) == 1
    assert runner.exit_status((0, 3)) == 1
