"""The pool's own cost per statement in CPU instructions (valgrind's callgrind), not seconds.

Instruction counts repeat to a fraction of a percent on a loaded machine, so this is the
hot path's regression figure. Each target (a pool of 3 replicas, ``in_order``, every other
setting its default; and a bare clickhouse-connect client) runs in its own Python process
under callgrind, over the same FAKE transport: urllib3's connections get an in-memory socket
that answers each request with the bytes a real replica answered it with (recorded once from
a LocalCluster into bench/callgrind_responses.json). No network, no server, no clock-bound
waits: the counts are the client-side work only.

In each process, callgrind dumps the counters of the thread that runs the statements each time a
phase ends with a call of ``os.getppid`` (a C function nothing on the measured path calls); a phase of
N statements and one of 2N are run per statement kind, and their difference / N is one
statement's cost (start-up, imports and first-use work cancel out). The pool's own cost is the
pool's per-statement count less the bare client's. The process's other threads (the pool's
watchdog) are counted apart, over the whole run, and reported per statement run ("other
threads"): they run when the scheduler lets them, so counted with the phases they moved the
figure from run to run (see :func:`measure`). No garbage collection runs during the phases
(see :func:`run_phases`), and each target is measured in ``--layouts`` memory layouts, the
median reported with each layout's figure (see :data:`LAYOUT_PADS`: where objects land moves the
count by up to a tenth of the pool's own), so that a change of the code is judged over layouts,
not by one layout's luck. Runs at other times still differ by a few thousand (a layout's count
by up to 10,000, the median by up to 4,000): compare trees run side by side, in one run.

    python bench/callgrind_statement_cost.py [--n 50] [--layouts 3] [--jobs 2] [--record]

``query`` is charged the reading of its one-row result, which the pool does inside the attempt
(``clickhouse_lb.pools._leftovers.settled``) and the bare client never does unless asked;
``query_rows`` reads the rows in both targets, as a caller would, and so counts the pool's own
work only (the difference between the two kinds is clickhouse-connect's parsing of the answer).

``PYTHONPATH`` picks the clickhouse_lb measured (e.g. ``PYTHONPATH=/work/main`` for main's tree):
the script is the same for both. ``--record`` re-records the answers (needs the [local] extra).
"""

from __future__ import annotations

import argparse
import base64
import gc
import glob
import io
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

RESPONSES = Path(__file__).with_name("callgrind_responses.json")
HOSTS = ["10.255.0.1:8123", "10.255.0.2:8123", "10.255.0.3:8123"]  # never reached: the socket is fake
TABLE = "callgrind_t"
KINDS = ("query", "query_rows", "command", "insert")


#: The ``query=`` parameter of a URL's query string.
_QUERY_PARAMETER = re.compile(r"(?:^|&)query=([^&]*)")


def request_key(request: bytes) -> str:
    """The statement a request carries (its SQL, from the URL's ``query=`` or the body), without
    what changes from run to run (query ids, session settings).

    Only ``query=`` is read from the URL, by one regular expression: this is the fake server's
    work, counted with the client's, so it must cost the same whatever else the URL carries
    (``parse_qs`` of the whole query string charged each further parameter of the pool's
    requests, an insert's deduplication token, to the pool: about 120 bytecodes)."""
    head, _, body = request.partition(b"\r\n\r\n")
    target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode("latin-1")
    path, _, query_string = target.partition("?")
    query = _QUERY_PARAMETER.search(query_string)
    if query:
        sql = unquote_plus(query.group(1))
    elif path.endswith("/ping"):
        sql = "PING"
    else:
        if b"\r\n" in body[:8] and head.lower().count(b"transfer-encoding: chunked"):
            body = body.split(b"\r\n", 1)[1]
        sql = body.decode("utf-8", "replace")
        insert = re.search(r"INSERT INTO .*?FORMAT \w+", sql)  # an insert's body may be compressed
        if insert:
            sql = insert.group(0)
    return " ".join(sql.split())[:120]


class FakeSocket:
    """What an urllib3 connection needs of a socket: writes are kept until the response is read;
    each read is the recorded answer to the request written. ``fileno`` is one end of a socket
    pair that never gets data, so urllib3's "is the connection still up?" check says yes."""

    answers: dict[str, bytes] = {}

    def __init__(self) -> None:
        self._pair = socket.socketpair()
        self._sent = bytearray()

    def sendall(self, data: bytes | memoryview) -> None:
        self._sent += data

    def send(self, data: bytes | memoryview) -> int:
        self._sent += data
        return len(data)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        request = bytes(self._sent)
        self._sent.clear()
        answer = self.answers.get(request_key(request))
        if answer is None:
            raise RuntimeError(f"no recorded answer for {request_key(request)!r}: run with --record")
        return io.BufferedReader(io.BytesIO(answer))  # type: ignore[arg-type]

    def fileno(self) -> int:
        return self._pair[0].fileno()

    def close(self) -> None:
        for end in self._pair:
            end.close()

    def shutdown(self, how: int) -> None:
        pass

    def settimeout(self, value: float | None) -> None:
        pass

    def gettimeout(self) -> float | None:
        return None

    def setsockopt(self, *args: Any) -> None:
        pass


def install_fake_transport() -> None:
    import urllib3.connection

    FakeSocket.answers = {key: base64.b64decode(value) for key, value in json.loads(RESPONSES.read_text()).items()}
    urllib3.connection.HTTPConnection._new_conn = lambda self: FakeSocket()  # type: ignore[method-assign]


def statements(target: Any) -> dict[str, Callable[[], object]]:
    return {
        "query": lambda: target.query("SELECT 1"),
        # The same query with its rows read, as a caller does: the pool reads them inside the
        # attempt (clickhouse_lb.pools._leftovers.settled), a bare client's caller afterwards, so
        # that this kind's difference leaves out the parsing both pay, which "query" charges
        # to the pool.
        "query_rows": lambda: target.query("SELECT 1").result_rows,
        "command": lambda: target.command(f"CREATE TABLE IF NOT EXISTS {TABLE} (x UInt8) ENGINE = Memory"),
        "insert": lambda: target.insert(TABLE, [[1]], column_names=["x"], column_type_names=["UInt8"]),
    }


def make_target(kind: str, hosts: list[str]) -> Any:
    import clickhouse_connect

    if kind == "bare":
        host, _, port = hosts[0].rpartition(":")
        return clickhouse_connect.get_client(host=host, port=int(port), autogenerate_session_id=False,
                                             query_retries=0)
    import clickhouse_lb

    # Nothing that runs on a clock: background probes off, and the liveness check armed (as by
    # default) but far later than any statement here takes under callgrind (50-100x slower).
    return clickhouse_lb.get_pool(hosts, load_balancing="in_order", health_check_interval_ms=0,
                                  liveness_check_after_ms=60_000)


def run_phases(kind: str, n: int, pad: int = 0) -> None:
    """The process callgrind watches: warm up, then each statement kind N and 2N times, each
    phase ended by ``os.getppid()`` (the C function callgrind dumps its counters after).
    ``pad``: objects made before anything is imported, which moves where everything after them
    lands in memory (see :data:`LAYOUT_PADS`)."""
    padding = [str(i) * 3 for i in range(pad)]  # noqa: F841 (kept alive: the layout it makes must last)
    install_fake_transport()
    target = make_target(kind, HOSTS)
    calls = statements(target)
    for call in calls.values():
        for _ in range(20):
            call()
    # The start-up heap (imports, the clients) is left out of later collections: a full
    # collection of it would land in whichever phase reaches the threshold first, a one-time
    # cost of millions of instructions. The young generations are collected as usual.
    gc.collect()
    gc.freeze()
    # No collection during the phases either: a young collection lands in whichever phase the
    # process's allocations (the other threads' included) reach the threshold in, and moved the
    # figure by up to 9,000 instructions between runs of one tree (without, one pair of runs
    # agreed within 700; runs at other loads still move by a few thousand: compare trees run
    # side by side). The statements measured leave no cyclic garbage (reads, commands; an
    # insert 7 objects, in the bare client's code and the pool's alike), so nothing is left out.
    gc.disable()
    os.getppid()  # dump 1: start-up and warm-up
    for name in KINDS:
        call = calls[name]
        for count in (n, 2 * n):
            for _ in range(count):
                call()
            os.getppid()  # the end of a phase: callgrind dumps its counters
    target.close()


def _summary(path: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no summary line in {path}")


def totals(prefix: str) -> list[int]:
    """The calling thread's count at each phase end (``prefix.K-01``: callgrind's thread 1, the
    one whose ``os.getppid`` call dumps), in phase order."""
    counts: list[tuple[int, int]] = []
    for path in glob.glob(prefix + ".*-01"):
        part = path.rsplit(".", 1)[1].split("-")[0]
        if part.isdigit() and int(part) > 0:
            counts.append((int(part), _summary(path)))
    return [count for _, count in sorted(counts)]


def other_threads(prefix: str) -> int:
    """Everything the process's other threads (the watchdog, the executors) ran over the whole
    run: callgrind's final per-thread files ``prefix-TT``, TT >= 02."""
    return sum(_summary(path) for path in glob.glob(prefix + "-*") if not path.endswith("-01"))


def statements_run(n: int) -> int:
    """Statements each measured process runs: 20 of each kind to warm up, then N and 2N."""
    return len(KINDS) * (20 + 3 * n)


def measure(kind: str, n: int, pad: int = 0) -> dict[str, float]:
    """Instructions per statement of each kind for one target (``pool`` or ``bare``), counted
    on the thread that runs the statements; ``"other threads"``: what the process's other
    threads ran over the whole run, per statement run.

    The two are counted apart (``--separate-threads=yes``) because the other threads run when
    the scheduler lets them, not at a fixed point of a phase: counted with the caller's, a
    watchdog look or a thread start landed in whichever phase it happened to (main's watchdog
    thread ran 10.5 million instructions in one run of 720 statements, and the figure moved by
    up to 15,000 instructions between runs of one tree). The other threads' is reported beside
    it, as an average."""
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "callgrind.out")
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={prefix}", "--dump-after=os_getppid",
            "--dump-instr=no", "--compress-strings=no", "--separate-threads=yes",
            sys.executable, __file__, "--phases", kind, "--n", str(n), "--pad", str(pad),
        ]
        # A fixed hash seed: set and dict layouts (and so their probing) repeat from run to run.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        counts = totals(prefix)
        background = other_threads(prefix)
    expected = 1 + 2 * len(KINDS)
    if len(counts) != expected:
        raise RuntimeError(f"expected {expected} callgrind dumps, got {len(counts)}: {counts}")
    phases = counts[1:expected]
    if os.environ.get("CALLGRIND_VERBOSE"):
        print(kind, "phase totals:", phases, "other threads:", background, file=sys.stderr)
    result = {name: (phases[2 * i + 1] - phases[2 * i]) / n for i, name in enumerate(KINDS)}
    result["other threads"] = background / statements_run(n)
    return result


def record() -> None:
    """Answers of a real replica to every request the measured processes send."""
    import urllib3.connection

    from clickhouse_lb.testing import LocalCluster

    answers: dict[str, str] = {}
    original = urllib3.connection.HTTPConnection._new_conn

    class Recording:
        def __init__(self, real: socket.socket) -> None:
            self._real = real
            self._sent = bytearray()

        def sendall(self, data: bytes) -> None:
            self._sent += data
            self._real.sendall(data)

        def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
            key = request_key(bytes(self._sent))
            self._sent.clear()
            raw = self._real.makefile("rb", buffering=0)
            got = bytearray()

            class Tee(io.RawIOBase):
                def readable(self) -> bool:
                    return True

                def readinto(self, buffer: Any) -> int:
                    size = raw.readinto(buffer) or 0
                    got.extend(bytes(buffer[:size]))
                    answers[key] = base64.b64encode(bytes(got)).decode()
                    return size

            return io.BufferedReader(Tee())

        def __getattr__(self, name: str) -> Any:
            return getattr(self._real, name)

    urllib3.connection.HTTPConnection._new_conn = (  # type: ignore[method-assign]
        lambda self: Recording(original(self))
    )
    with LocalCluster(replicas=3) as cluster:
        for kind in ("bare", "pool"):
            target = make_target(kind, cluster.hosts)
            for call in statements(target).values():
                call()
                call()
            target.close()
    RESPONSES.write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(answers)} answers into {RESPONSES}")


#: The layouts each target is measured in (objects made before the imports, see run_phases).
#: CPython's type attribute cache is indexed by a type's version tag and the *address* of the
#: attribute's name, so where the interpreter's objects land decides which of a statement's
#: attribute look-ups collide there and walk the class hierarchy instead, and which dict look-ups
#: probe further: 1,000 strings made before the imports moved the pool's own count of one
#: tree by 7,500 instructions for a read and 14,000 for an insert, with the same bytecodes
#: run. Any change to the code moves that layout too, so a single layout cannot tell a change's
#: cost from its luck: the figure is the median over several, with their range.
LAYOUT_PADS = (0, 1000, 2311, 4099, 6007)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50, help="statements per phase (and 2N)")
    parser.add_argument("--layouts", type=int, default=3, choices=range(1, len(LAYOUT_PADS) + 1),
                        metavar=f"1..{len(LAYOUT_PADS)}", help="memory layouts per target (the median is reported)")
    parser.add_argument("--jobs", type=int, default=2, help="processes under callgrind at once")
    parser.add_argument("--record", action="store_true", help="re-record the replica's answers")
    parser.add_argument("--phases", choices=("pool", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--pad", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phases:
        run_phases(args.phases, args.n, args.pad)
        return 0
    if args.record:
        record()
        return 0
    import clickhouse_lb

    started = time.monotonic()
    pads = LAYOUT_PADS[: args.layouts]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as runs:
        pending = {(target, pad): runs.submit(measure, target, args.n, pad)
                   for pad in pads for target in ("bare", "pool")}
        counts = {key: future.result() for key, future in pending.items()}
    print(f"clickhouse_lb from {Path(clickhouse_lb.__file__).parent}; N={args.n}; layouts {len(pads)}; "
          f"{time.monotonic() - started:.0f} s under callgrind")
    print("| statement | bare client (instr/stmt) | pool (instr/stmt) | pool's own (instr/stmt) "
          "| pool's own, per layout |")
    print("|---|---:|---:|---:|---|")
    for name in (*KINDS, "other threads"):
        bare = [counts["bare", pad][name] for pad in pads]
        pool = [counts["pool", pad][name] for pad in pads]
        own = [p - b for p, b in zip(pool, bare)]
        print(f"| {name} | {statistics.median(bare):,.0f} | {statistics.median(pool):,.0f} | "
              f"{statistics.median(own):,.0f} | {' / '.join(f'{o:,.0f}' for o in own)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
