"""The ``clickhouse-lb`` command against real replicas.

``status`` runs in-process against the session's cluster with one replica killed; ``demo`` runs
end to end as a subprocess (its own local cluster), once to completion and once interrupted
with SIGINT, and must leave no replica process behind.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from clickhouse_lb.cli._main import main
from clickhouse_lb.testing import ClusterBase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

REPLICA_MODULE = "clickhouse_lb.testing.replica"
# -X faulthandler: a command that does not exit when it should is sent SIGABRT and prints every
# thread's stack (``exit_status``), so that a failure says where it was stuck.
DEMO = [sys.executable, "-X", "faulthandler", "-m", "clickhouse_lb", "demo"]


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


def test_status_with_one_replica_killed(cluster: ClusterBase, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.kill(1)
    assert main(["status", *cluster.hosts, "--json", "--min-healthy", "3", "--timeout", "2"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["healthy"], report["total"], report["ok"]) == (2, 3, False)
    rows = {r["address"]: r for r in report["replicas"]}
    killed = rows[cluster.hosts[1]]
    assert killed["up"] is False
    assert killed["errors_count"] >= 1  # the check's failure, and the pool's probes'
    assert killed["probe_state"] == "down"
    assert killed["estimated_recovery_time"] > 0
    for i in (0, 2):
        live = rows[cluster.hosts[i]]
        assert live["up"] is True
        assert live["version"]  # SELECT version() answered
        assert live["latency_ms"] is not None
        assert live["errors_count"] == 0
        assert live["probe_state"] == "up"
        assert live["delay"] == 0.0  # read from system.replicas: nothing to replicate
    # The same check as a table, satisfied with two healthy replicas (one host list argument).
    assert main(["status", ",".join(cluster.hosts), "--min-healthy", "2", "--timeout", "2"]) == 0
    table = capsys.readouterr().out
    assert "2/3 replicas answered (min 2): OK" in table
    assert "connection refused" in table


def replica_processes(parent: int) -> list[str]:
    """Live (not zombie) replica processes that ``parent`` started (they carry --parent-pid)."""
    # -ww: full command lines whatever COLUMNS says (pytest sets it).
    ps = ["ps", "-ww", "-eo", "pid=,stat=,args="]
    listing = subprocess.run(ps, capture_output=True, text=True, check=True).stdout
    found = []
    for line in listing.splitlines():
        pid, stat, args = line.strip().split(None, 2)
        if REPLICA_MODULE in args and f"--parent-pid {parent}" in args and not stat.startswith("Z"):
            found.append(f"{pid} {args}")
    return found


def read_lines(stream: object) -> queue.Queue[str | None]:
    """Lines of a pipe, as a queue (None at the end), so that the reader can poll with a deadline."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def exit_status(proc: subprocess.Popen[str], timeout: float, lines: queue.Queue[str | None] | None = None) -> int:
    """The command's exit status within ``timeout``; past it, its threads' stacks (SIGABRT to a
    command run with ``-X faulthandler``) in the failure."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait(timeout=30)
        told = proc.stderr.read() if proc.stderr is not None else ""
        if lines is not None:
            told = rest_of(lines, 5) + told
        raise AssertionError(f"{proc.args} did not exit within {timeout:g}s; its stacks:\n{told}") from None


def wait_for_line(lines: queue.Queue[str | None], needle: str, timeout: float) -> list[str]:
    """Lines read until one contains ``needle``; fails at the deadline or at the end of output."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no line with {needle!r} within {timeout}s; got:\n{''.join(seen)}")
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            raise AssertionError(f"output ended before a line with {needle!r}:\n{''.join(seen)}")
        seen.append(line)
        if needle in line:
            return seen


@pytest.fixture(autouse=True)
def interruptible_commands() -> Iterator[None]:
    """The commands here are stopped with SIGINT, as Ctrl-C does. A process started with SIGINT
    ignored (a background job of a non-interactive shell, ``nohup ... &``) hands that on to every
    process it starts, and Python keeps an inherited "ignore": the commands could not be
    interrupted (the demo ran to its end, exit 0; the cluster served on). So while these tests
    run, this process does not ignore it; the commands it starts then get the default."""
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if previous == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture
def demo_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CLICKHOUSE_LB_CLUSTER", None)
    env["NO_COLOR"] = "1"
    return env


def rest_of(lines: queue.Queue[str | None], timeout: float) -> str:
    """Everything left in ``lines`` up to the end of the output."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while (line := lines.get(timeout=max(0.01, deadline - time.monotonic()))) is not None:
        seen.append(line)
    return "".join(seen)


def test_demo_end_to_end(demo_env: dict[str, str]) -> None:
    started = time.monotonic()
    proc = subprocess.Popen([*DEMO, "--duration", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=demo_env)
    try:
        lines = read_lines(proc.stdout)
        head = "".join(wait_for_line(lines, "cluster up", timeout=45))
        assert len(replica_processes(proc.pid)) == 3, head
        assert proc.wait(timeout=60) == 0, head + rest_of(lines, 5) + proc.stderr.read()  # type: ignore[union-attr]
        out = head + rest_of(lines, 5)
        err = proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    elapsed = time.monotonic() - started
    assert "\x1b[" not in out  # plain output on a pipe
    assert "killed r" in out
    assert "failover:" in out
    assert "restarted r" in out
    assert "served a statement again" in out
    assert "failed 0" in out
    assert "[yes] no statement failed" in out
    assert "[NO" not in out
    for strategy in ("round_robin", "in_order", "random", "nearest_hostname", "first_or_random"):
        assert f"\n  {strategy} " in out
    assert re.search(r"^takes about \d+ s", out, re.MULTILINE), out
    assert "errors_count: failed attempts the pool counted against a replica" in out
    # The summary counts the failover part only, and its claim quotes its own table.
    assert "the strategy tour is not counted" in out
    claim = re.search(r"\[yes\] (r\d)'s errors rose while it was down \((\d+) recorded\)", out)
    assert claim is not None, out
    victim, recorded = claim.groups()
    row = re.search(rf"^  {victim} .*$", out.split("Summary of parts 2 and 3")[1], re.MULTILINE)
    assert row is not None, out
    assert row.group(0).split()[-1] == recorded, out
    assert err == ""  # the library's logs stay quiet without -v
    assert replica_processes(proc.pid) == []
    assert elapsed < 60


def test_demo_interrupted_cleans_up(demo_env: dict[str, str]) -> None:
    proc = subprocess.Popen([*DEMO, "--duration", "30", "--strategy", "in_order"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=demo_env)
    try:
        lines = read_lines(proc.stdout)
        head = wait_for_line(lines, "1. The strategies", timeout=45)
        assert len(replica_processes(proc.pid)) == 3, "".join(head)
        proc.send_signal(signal.SIGINT)
        assert exit_status(proc, 30, lines) == 130
        rest = wait_for_line(lines, "interrupted", timeout=5)
        assert "Traceback" not in "".join(rest)
        assert replica_processes(proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


CLUSTER = [sys.executable, "-X", "faulthandler", "-m", "clickhouse_lb", "cluster"]


def test_cluster_command_end_to_end(demo_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """``clickhouse-lb cluster --json``: its first line is what a script needs; ``status`` and a
    pool work against the DSN as printed, the URL through SQLAlchemy; Ctrl-C stops every
    replica, removes its directory, exit 0."""
    import clickhouse_lb

    command = [*CLUSTER, "--json", "--user", "user:p@ss", "--database", "analytics"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=demo_env)
    try:
        lines = read_lines(proc.stdout)
        first = lines.get(timeout=60)
        assert first is not None
        assert first.startswith("{"), first
        found = json.loads(first)
        rest = "".join(wait_for_line(lines, "serving until Ctrl-C", timeout=10))
        assert found["dsn"] in rest
        assert found["url"] in rest
        base_dir = found["base_dir"]
        assert os.path.isdir(base_dir)
        assert len(found["hosts"]) == 3
        assert len(replica_processes(proc.pid)) == 3
        assert found["dsn"].startswith("clickhouse://user:p%40ss@")
        assert found["dsn"].endswith("/analytics")

        assert main(["status", found["dsn"], "--json", "--min-healthy", "3", "--timeout", "5"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert sorted(r["address"] for r in report["replicas"]) == sorted(found["hosts"])

        # read_your_writes: the count right after the insert goes to a replica that has it
        # (replication is asynchronous: another replica may not have the rows yet).
        with clickhouse_lb.get_pool(dsn=found["dsn"], read_your_writes=1) as pool:
            assert pool.command("SELECT currentDatabase()") == "analytics"
            pool.command("CREATE TABLE events ON CLUSTER lb_cluster (x UInt32) "
                         "ENGINE = ReplicatedMergeTree ORDER BY x")
            pool.insert("events", [[1], [2], [3]], column_names=["x"])
            assert pool.query("SELECT count() FROM events").result_rows == [(3,)]

        import sqlalchemy

        engine = sqlalchemy.create_engine(found["url"])
        try:
            with engine.connect() as connection:
                assert connection.execute(sqlalchemy.text("SELECT currentDatabase()")).scalar() == "analytics"
        finally:
            engine.dispose()

        proc.send_signal(signal.SIGINT)
        assert exit_status(proc, 30, lines) == 0, rest_of(lines, 5) + proc.stderr.read()  # type: ignore[union-attr]
        tail = rest_of(lines, 5)
        assert "stopped" in tail
        assert "Traceback" not in proc.stderr.read()  # type: ignore[union-attr]
        assert replica_processes(proc.pid) == []
        assert not os.path.exists(base_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cluster_command_stops_on_sigterm(demo_env: dict[str, str]) -> None:
    proc = subprocess.Popen([*CLUSTER, "--json", "--replicas", "1", "--shared-port"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=demo_env)
    try:
        lines = read_lines(proc.stdout)
        first = lines.get(timeout=60)
        assert first is not None
        found = json.loads(first)
        wait_for_line(lines, "serving until Ctrl-C", timeout=10)
        assert len(replica_processes(proc.pid)) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert replica_processes(proc.pid) == []
        assert not os.path.exists(found["base_dir"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
