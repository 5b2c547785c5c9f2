"""SELECT 1 through clickhouse-connect: this tree's local replica side by side with another git ref's.

    python bench/bench_http_layer.py [--baseline-ref main] [--rounds 20] [--per-round 100]

Starts one replica process from this working tree and one from ``--baseline-ref`` (exported
with ``git archive`` into a temporary directory), then measures ``client.query("SELECT 1")``
and ``client.command("SELECT 1")`` against both in alternating rounds, so the noise of a shared
machine hits both alike. Prints a markdown table for BENCHMARKS.md. Used to compare the replica's
HTTP layers (hand-written socketserver code before, h11 after, see issue 17).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import clickhouse_connect

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def _replica(tree: Path, work: Path, name: str) -> Iterator[int]:
    data_dir = work / f"data-{name}"
    data_dir.mkdir()
    port_file = data_dir / "port"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "clickhouse_lb.testing.replica", "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--name", name, "--data-dir", str(data_dir), "--port-file", str(port_file)]
    proc = subprocess.Popen(cmd, env=env, cwd=str(data_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"replica from {tree} did not start")
            time.sleep(0.05)
        yield int(port_file.read_text())
    finally:
        proc.kill()
        proc.wait()


def _export(ref: str, into: Path) -> Path:
    archive = into / "baseline.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", ref, "clickhouse_lb"], stdout=out, check=True)
    tree = into / "tree-baseline"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _round(fn: Callable[[], object], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-ref", default="main")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        work = Path(tmp)
        baseline = _export(args.baseline_ref, work)
        with _replica(baseline, work, "baseline") as old_port, _replica(ROOT, work, "current") as new_port:
            clients = {
                f"{args.baseline_ref} (baseline)": clickhouse_connect.get_client(host="127.0.0.1", port=old_port),
                "this tree": clickhouse_connect.get_client(host="127.0.0.1", port=new_port),
            }
            samples: dict[tuple[str, str], list[float]] = {}
            for client in clients.values():  # warm-up
                _round(lambda c=client: c.query("SELECT 1"), 50)
            for _ in range(args.rounds):
                for label, client in clients.items():
                    for kind in ("query", "command"):
                        call = getattr(client, kind)
                        taken = _round(lambda f=call: f("SELECT 1"), args.per_round)
                        samples.setdefault((label, kind), []).extend(taken)
    load = os.getloadavg()
    total = args.rounds * args.per_round
    print(f"| replica code | call | median | p95 | ({total} round trips each, alternating rounds) |")
    print("|---|---|---|---|---|")
    for (label, kind), values in samples.items():
        values.sort()
        med, p95 = statistics.median(values) * 1000, values[int(len(values) * 0.95)] * 1000
        print(f"| {label} | `client.{kind}('SELECT 1')` | {med:.2f} ms | {p95:.2f} ms | |")
    averages = ", ".join(f"{x:.1f}" for x in load)
    print(f"\nload average at the end (1, 5, 15 min): {averages} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
