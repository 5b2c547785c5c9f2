"""A test run leaves nothing behind outside the checkout's ignored paths: no ``.hypothesis/`` in
the working directory (tests/conftest.py moves Hypothesis' storage under ``.pytest_cache/``) and
no ``pytest-N`` folder in the system temp dir after a passing run (pyproject's
``tmp_path_retention_policy = "failed"``).

The check runs pytest in a subprocess, from an empty working directory, on the two small tests
below (a Hypothesis test and a ``tmp_path`` test), with pytest's temp root redirected
(``PYTEST_DEBUG_TEMPROOT``) to a folder of its own, and then looks at what is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import HYPOTHESIS_DIR

ROOT = Path(__file__).resolve().parents[1]
_INNER = "CLICKHOUSE_LB_HOUSEKEEPING_INNER"
inner_only = pytest.mark.skipif(os.environ.get(_INNER) != "1", reason="run by test_a_passing_run_leaves_nothing")


@inner_only
@settings(max_examples=5, deadline=None)
@given(st.integers())
def test_inner_hypothesis(n: int) -> None:
    assert n == n  # noqa: PLR0124 (a property that always holds: Hypothesis still writes its storage)


@inner_only
def test_inner_tmp_path(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("written by a test", encoding="utf-8")


def test_a_passing_run_leaves_nothing(tmp_path: Path) -> None:
    workdir, temproot = tmp_path / "cwd", tmp_path / "temproot"
    workdir.mkdir()
    temproot.mkdir()
    env = {**os.environ, _INNER: "1", "PYTEST_DEBUG_TEMPROOT": str(temproot)}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(ROOT),
            f"{Path(__file__).resolve()}::test_inner_hypothesis",
            f"{Path(__file__).resolve()}::test_inner_tmp_path",
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout, done.stdout
    assert list(workdir.iterdir()) == [], "the run wrote into its working directory"
    assert HYPOTHESIS_DIR.is_dir()  # where Hypothesis wrote instead (ignored: .pytest_cache/)
    left = [p for p in temproot.glob("pytest-of-*/*") if p.name != "pytest-current"]
    assert left == [], f"left in the temp dir: {left}"
