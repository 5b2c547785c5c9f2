"""Quiet by default: what one failover prints on stderr, in a fresh interpreter.

Each case runs a small program in a subprocess (so that logging starts unconfigured, as in a
user's script) against the session's cluster with replica 0 killed: an ``in_order`` pool tries
replica 0 first, fails over to replica 1 and succeeds. The stderr lines are the user's view.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from clickhouse_lb.testing import ClusterBase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DRIVER_NOISE = "Unexpected Http Driver Exception"

SYNC = """
import clickhouse_lb
pool = clickhouse_lb.get_pool(HOSTS, load_balancing="in_order")
assert pool.command("SELECT 1") == 1
pool.close()
"""

ASYNC = """
import asyncio
import clickhouse_lb

async def main():
    async with clickhouse_lb.get_async_pool(HOSTS, load_balancing="in_order") as pool:
        assert await pool.command("SELECT 1") == 1

asyncio.run(main())
"""

SQLALCHEMY = """
from sqlalchemy import create_engine, text
host_params = "&".join(f"host={h}" for h in HOSTS)
engine = create_engine(f"clickhousedb+lb://default@/default?{host_params}&load_balancing=in_order")
with engine.connect() as conn:
    assert conn.execute(text("SELECT 1")).scalar() == 1
engine.dispose()
"""


def stderr_lines(cluster: ClusterBase, program: str, logging_setup: str = "") -> list[str]:
    """The program's stderr lines (the health probes are on, as by default: their "replica ...
    is down" report and the failover's share one WARNING per outage)."""
    source = f"import logging\n{logging_setup}\nHOSTS = {cluster.hosts!r}\n{textwrap.dedent(program)}"
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


@pytest.fixture
def first_replica_down(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    healthy_clickhouse_cluster.kill(0)
    return healthy_clickhouse_cluster


@pytest.mark.parametrize("program", [SYNC, ASYNC], ids=["sync", "async"])
def test_one_failover_prints_one_line_when_logging_is_unconfigured(
    first_replica_down: ClusterBase, program: str
) -> None:
    lines = stderr_lines(first_replica_down, program)
    assert len(lines) == 1, lines
    # Whoever saw the outage first reports it: the failover, or the probes.
    assert first_replica_down.hosts[0] in lines[0], lines
    assert f"failing over to {first_replica_down.hosts[1]}" in lines[0] or "is down" in lines[0], lines


def test_a_sqlalchemy_connection_placed_past_a_dead_replica_prints_at_most_one_line(
    first_replica_down: ClusterBase,
) -> None:
    lines = stderr_lines(first_replica_down, SQLALCHEMY)
    assert len(lines) <= 1, lines
    assert not any(DRIVER_NOISE in line for line in lines)


def test_basic_config_shows_the_pools_warning_not_the_drivers(first_replica_down: ClusterBase) -> None:
    """(urllib3 may add its own "Retrying" record here: the root handler shows every library's.)"""
    lines = stderr_lines(first_replica_down, SYNC, "logging.basicConfig(level=logging.WARNING)")
    assert sum(line.startswith("WARNING:clickhouse_lb:") for line in lines) == 1, lines
    assert not any(line.startswith("WARNING:clickhouse_connect") for line in lines), lines


def test_driver_records_are_shown_to_applications_that_configure_that_logger(
    first_replica_down: ClusterBase,
) -> None:
    setup = (
        "logging.basicConfig(level=logging.WARNING)\n"
        'logging.getLogger("clickhouse_connect").setLevel(logging.WARNING)'
    )
    lines = stderr_lines(first_replica_down, SYNC, setup)
    assert any(DRIVER_NOISE in line for line in lines), lines
    assert sum(line.startswith("WARNING:clickhouse_lb:") for line in lines) == 1, lines


def test_driver_records_outside_the_pool_are_untouched(first_replica_down: ClusterBase) -> None:
    """A plain clickhouse-connect client in the same program logs as it always did."""
    program = """
    import clickhouse_connect
    import clickhouse_lb  # importing the library installs the filter
    host, port = HOSTS[0].rsplit(":", 1)
    try:
        clickhouse_connect.get_client(host=host, port=int(port), query_retries=0)
    except Exception:
        pass
    """
    lines = stderr_lines(first_replica_down, program)
    assert any(DRIVER_NOISE in line for line in lines), lines


def test_a_session_losing_its_replica_prints_nothing_but_raises(healthy_clickhouse_cluster: ClusterBase) -> None:
    """The pinned session's SessionLostError says it all: no driver record on stderr (at most
    the probes' one line for the outage)."""
    cluster = healthy_clickhouse_cluster
    program = f"""
import sys
import clickhouse_lb
HOSTS = {cluster.hosts!r}
with clickhouse_lb.get_pool(HOSTS, load_balancing="in_order") as pool, pool.session() as client:
    assert client.command("SELECT 1") == 1
    print("ready", flush=True)
    sys.stdin.readline()  # the test kills the session's replica meanwhile
    try:
        client.command("SELECT 1")
    except clickhouse_lb.SessionLostError:
        print("lost", flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        cluster.kill(0)
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.strip() == "lost"
    # No driver record. The health probes may see the kill before the statement does: their
    # "replica ... is down" is then the outage's one line, as in the tests above (a busy run).
    lines = err.splitlines()
    assert len(lines) <= 1, lines
    assert all(cluster.hosts[0] in line and "is down" in line for line in lines), lines
