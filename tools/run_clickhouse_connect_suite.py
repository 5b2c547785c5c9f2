"""Run clickhouse-connect's own integration suite against one LocalCluster replica.

    python tools/run_clickhouse_connect_suite.py /path/to/clickhouse-connect [pytest args...]

The path is a checkout (or an export) of the clickhouse-connect repository that holds
``tests/integration_tests``; its code is not part of this project and is never copied here.
The suite needs, beside this project's test extra: pytest-mock, pytest-dotenv, polars, alembic
and pyjwt[crypto]. The installed clickhouse-connect is the one tested (the checkout's
``clickhouse_connect`` package is kept off ``sys.path`` by running from a copy of ``tests/``).

One replica is started; the suite's own
configuration variables (``CLICKHOUSE_CONNECT_TEST_*``) point it there, and pytest writes a JUnit
XML report whose outcome counts and failures (grouped by the first line of their message) are
printed at the end. Results are recorded in docs/local-cluster.md ("Fidelity").
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from clickhouse_lb.testing import LocalCluster


def _summarise(report: Path, out: Path) -> None:
    root = ET.parse(report).getroot()
    counts: collections.Counter[str] = collections.Counter()
    failures: list[tuple[str, str]] = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                first = (child.get("message") or "").strip().splitlines()
                failures.append((name, first[0][:200] if first else child.tag))
            elif child.tag == "skipped":
                outcome = "skipped"
        counts[outcome] += 1
    ran = counts["passed"] + counts["failed"]
    lines = [
        f"passed {counts['passed']}, failed {counts['failed']}, skipped {counts['skipped']}",
        f"pass rate (of the tests that ran): {counts['passed'] / ran:.1%}" if ran else "nothing ran",
        "",
    ]
    lines += [f"FAILED {name}: {message}" for name, message in sorted(failures)]
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    print(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, help="clickhouse-connect repository (needs tests/integration_tests)")
    parser.add_argument("--report-dir", type=Path, default=Path("cc-suite-report"))
    args, pytest_args = parser.parse_known_args()  # the rest goes to pytest
    tests = args.checkout / "tests"
    if not (tests / "integration_tests").is_dir():
        parser.error(f"{args.checkout} has no tests/integration_tests")
    args.report_dir.mkdir(parents=True, exist_ok=True)
    report = (args.report_dir / "junit.xml").resolve()
    with tempfile.TemporaryDirectory(prefix="cc-suite-") as work, LocalCluster(replicas=1) as cluster:
        shutil.copytree(tests, Path(work) / "tests")
        host, port = cluster.address(0)
        env = dict(os.environ)
        env.update(
            {
                "CLICKHOUSE_CONNECT_TEST_HOST": host,
                "CLICKHOUSE_CONNECT_TEST_PORT": str(port),
            }
        )
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "tests/integration_tests",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_default_fixture_loop_scope=session",
            "-q",
            "--timeout=120",
            f"--junitxml={report}",
            *pytest_args,
        ]
        subprocess.run(cmd, cwd=work, env=env, check=False)
    if not report.exists():
        print("pytest wrote no report", file=sys.stderr)
        return 1
    _summarise(report, args.report_dir / "summary.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
