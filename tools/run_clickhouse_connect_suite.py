"""Run clickhouse-connect's own integration suite both ways and compare: plain clients, and every
``create_client``/``get_async_client`` replaced by a pool over 3 local replicas.

    python tools/run_clickhouse_connect_suite.py /path/to/suite [--report-dir DIR] [--modes plain,pool]
        [pytest args, e.g. a test path under tests/integration_tests or -k ...]

``/path/to/suite`` holds clickhouse-connect's ``tests/`` directory (``tests/integration_tests``
and its conftest): a checkout or an export of the clickhouse-connect repository. Nothing is
fetched here, and the suite's code is never copied into this project: export it once, e.g.
``git --git-dir=<clone>/.git archive HEAD tests | tar -x -C /tmp/cc`` (PyPI's sdist of
clickhouse-connect has no integration tests). The installed clickhouse-connect is the one tested.

One 3-replica ``LocalCluster`` serves both runs, one after the other:

* **plain**: the suite's ``CLICKHOUSE_CONNECT_TEST_HOST/PORT`` point at replica 1;
* **pool**: the same, with ``tools/_pool_as_client.py`` loaded (``-p``): every client the suite
  makes is ``get_pool(<3 replicas>, load_balancing="in_order", <the same keywords>)`` (async:
  ``get_async_pool``). With ``in_order`` every statement goes to replica 1 while it answers, as
  the plain run's do, so the runs differ by the client object only.

Each run writes a JUnit XML report (``DIR/plain.xml``, ``DIR/pool.xml``) and its pytest output
(``DIR/plain.log``, ``DIR/pool.log``); the comparison goes to ``DIR/comparison.md`` (and
stdout): pass counts both ways, the "Exception ignored" and INTERNALERROR lines of each run
(pytest's unraisable-exception report is on), the pool's passes as a share of the plain run's,
and every test whose outcome differs, with the first line of its failure. The suite also needs pytest-mock,
pytest-dotenv, polars, alembic and pyjwt[crypto]. Figures: docs/local-cluster.md ("Fidelity").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from clickhouse_lb.testing import LocalCluster

HERE = Path(__file__).resolve().parent
MODES = ("plain", "pool")


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """Per test id: ("passed" | "failed" | "skipped", first line of the failure)."""
    result: dict[str, tuple[str, str]] = {}
    if not report.exists():
        return result
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                first = (child.get("message") or "").strip().splitlines()
                outcome, why = "failed", (first[0][:200] if first else child.tag)
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        # A test that passed and then failed in teardown counts as failed (pytest reports both).
        if result.get(name, ("", ""))[0] != "failed":
            result[name] = (outcome, why)
    return result


def run(mode: str, suite: Path, hosts: list[str], database: str, *, report_dir: Path, pytest_args: list[str]) -> float:
    host, _, port = hosts[0].rpartition(":")
    env = {
        **os.environ,
        "CLICKHOUSE_CONNECT_TEST_HOST": host,
        "CLICKHOUSE_CONNECT_TEST_PORT": port,
        "CLICKHOUSE_CONNECT_TEST_DATABASE": database,
        # The suite's own tests/ package, and (pooled run) the plugin.
        "PYTHONPATH": os.pathsep.join([str(suite), str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    # pytest's report of unraisable exceptions stays on: an "Exception ignored" line is a finding
    # (clickhouse_lb.pools._leftovers), and the comparison counts them.
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=",
        "-o", "asyncio_default_fixture_loop_scope=session", "-q", "--timeout=120",
        f"--junitxml={(report_dir / f'{mode}.xml').resolve()}",
        *(pytest_args or ["tests/integration_tests"]),
    ]
    if mode == "pool":
        env["CLICKHOUSE_LB_SUITE_HOSTS"] = ",".join(hosts)
        command[3:3] = ["-p", "_pool_as_client"]
    started = time.monotonic()
    with (report_dir / f"{mode}.log").open("w") as out:
        subprocess.run(command, cwd=suite, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    return time.monotonic() - started


def log_findings(log: Path) -> tuple[int, int]:
    """("Exception ignored" lines, INTERNALERROR lines) in a run's pytest output."""
    if not log.exists():
        return 0, 0
    text = log.read_text(errors="replace")
    return text.count("Exception ignored"), text.count("INTERNALERROR>")


def compare(
    plain: dict[str, tuple[str, str]], pool: dict[str, tuple[str, str]], seconds: dict[str, float],
    findings: dict[str, tuple[int, int]] | None = None,
) -> str:
    def count(runs: dict[str, tuple[str, str]], outcome: str) -> int:
        return sum(1 for o, _ in runs.values() if o == outcome)

    findings = findings or {}
    lines = ['| run | passed | failed | skipped | "Exception ignored" | INTERNALERROR lines | minutes |',
             "|---|---:|---:|---:|---:|---:|---:|"]
    for mode, runs in (("plain clients", plain), ("get_pool, 3 replicas, in_order", pool)):
        key = "plain" if runs is plain else "pool"
        ignored, internal = findings.get(key, (0, 0))
        lines.append(f"| {mode} | {count(runs, 'passed')} | {count(runs, 'failed')} | "
                     f"{count(runs, 'skipped')} | {ignored} | {internal} | {seconds.get(key, 0) / 60:.1f} |")
    plain_passed = {name for name, (o, _) in plain.items() if o == "passed"}
    pool_passed = {name for name, (o, _) in pool.items() if o == "passed"}
    if plain_passed:
        share = len(pool_passed & plain_passed) / len(plain_passed)
        lines += ["", f"Of the {len(plain_passed)} tests plain clients pass, the pool passes "
                      f"{len(pool_passed & plain_passed)} ({share:.1%})."]
    only_plain = sorted(plain_passed - pool_passed)
    only_pool = sorted(pool_passed - plain_passed)
    lines += ["", f"Passed with plain clients only ({len(only_plain)}):"]
    lines += [f"- `{name}` (pool: {pool.get(name, ('not run', ''))[0]}) {pool.get(name, ('', ''))[1]}"
              for name in only_plain]
    lines += ["", f"Passed through the pool only ({len(only_pool)}):"]
    lines += [f"- `{name}` (plain: {plain.get(name, ('not run', ''))[0]}) {plain.get(name, ('', ''))[1]}"
              for name in only_pool]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", type=Path, help="a directory holding clickhouse-connect's tests/integration_tests")
    parser.add_argument("--report-dir", type=Path, default=Path("cc-suite-report"))
    parser.add_argument("--modes", default="plain,pool", help="comma-separated: plain, pool (default both)")
    args, pytest_args = parser.parse_known_args()  # the rest goes to pytest
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        parser.error(f"bad --modes {args.modes!r}: choose from {', '.join(MODES)}")
    if not (args.suite / "tests" / "integration_tests").is_dir():
        parser.error(f"{args.suite} has no tests/integration_tests")
    report_dir = args.report_dir.resolve()
    report_dir.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    # A copy of the suite's tests/ only: the checkout's own clickhouse_connect package must not
    # shadow the installed one.
    with tempfile.TemporaryDirectory(prefix="cc-suite-") as work, LocalCluster(replicas=3) as cluster:
        suite = Path(work)
        shutil.copytree(args.suite / "tests", suite / "tests")
        for mode in modes:
            # The suite's database on every replica (the suite makes it on the one it talks
            # to): a statement the pool fails over to another replica finds it there too.
            # Its tables are still on the first replica only: the replicas are independent.
            database = f"cc_suite_{mode}"
            cluster.on_all(f"CREATE DATABASE IF NOT EXISTS {database}")
            seconds[mode] = run(mode, suite, cluster.hosts, database, report_dir=report_dir, pytest_args=pytest_args)
    findings = {mode: log_findings(report_dir / f"{mode}.log") for mode in MODES}
    text = compare(outcomes(report_dir / "plain.xml"), outcomes(report_dir / "pool.xml"), seconds, findings)
    (report_dir / "comparison.md").write_text(text)
    print(text)
    return exit_status(findings["pool"])


def exit_status(pool_findings: tuple[int, int]) -> int:
    """1 when the pooled run left an "Exception ignored" or an INTERNALERROR line (what the pool
    must never cause, whatever the tests' own outcomes), else 0."""
    return 1 if any(pool_findings) else 0


if __name__ == "__main__":
    sys.exit(main())
