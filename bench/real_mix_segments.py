"""The real mix's pool-own time, segment by segment: where a cold ``pool.query`` spends it.

``bench/real_mix_split.py`` splits the pool's own time at the client's call. This splits it
further, at every step of one statement, to answer one question: is the cold cost a few
expensive steps (worth a targeted fix) or spread over all of them (only less work per
statement helps)? It copies the tree's ``clickhouse_lb`` to a scratch folder, adds a time mark
(``perf_counter`` into a list) at each anchor of :data:`ANCHORS`, and runs the real mix on that
copy: on a LocalCluster of 3 replicas, each measured ``pool.query("SELECT 1")`` (``in_order``,
or ``--strategy``; every other setting its default, so health probes and the watchdog run) follows an unmeasured
query to a random replica, as in ``bench/compare.py``. It prints the median of each segment
between consecutive marks, labelled with what runs there, and whether that is the statement's
core (taking the statement, ordering the replicas, the attempt, returning) or one of the
pool's features (statistics, lag and read-your-writes, the retry budget, the driver-log marker,
the load accounting, the watchdog).

Each mark costs about 0.1-0.3 us, so the segments add up to a little more than
``real_mix_split.py``'s figure; the client's own work (its request and the reading of the
result) is reported apart. An anchor that moved raises at once, naming it (update
:data:`ANCHORS` with the code).

    python bench/real_mix_segments.py [--tree PATH] [--strategy in_order] [--n 400] [--rounds 2]
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
MARKS_MODULE = "from time import perf_counter as now\nM: list = []\n"
IMPORT_MARKS = "from clickhouse_lb._segment_marks import M as _M, now as _now\n"


class Anchor(NamedTuple):
    """A mark named ``name`` put ``where`` (``before``/``after``) the line of ``file`` that holds
    ``line`` (stripped; a tuple: any of these, for trees from before and after a change): the
    only one, or with ``nth`` the nth of them (0: the first)."""

    file: str
    line: str | tuple[str, ...]
    where: str
    name: str
    nth: int | None = None


#: The marks, in the order a statement passes them; each segment is named by the mark it ends at.
ANCHORS = [
    Anchor("pools/pool.py", "if self._in_session is not None:  # session_id=: one replica, one ClickHouse session",
           "before", "in the pool's _call (the statement method's frame)"),
    Anchor("pools/_pool_steps.py", "order = view.balancer.plan_indices(call.overrides)", "before",
           "statement taken (prepare_call)"),
    Anchor("pools/_pool_steps.py", "health = view.health", "before", "replicas ordered (plan_indices)"),
    Anchor("pools/_pool_steps.py", "self._stats.count_statement()", "before",
           "feature: lag and read-your-writes checked"),
    Anchor("pools/_pool_steps.py", "balancer = view.balancer", "before",
           "feature: statistics counted, probe worker checked"),
    Anchor("pools/pool.py", "call, attempts, ryw = self._begin(method, args, kwargs, view)", "after",
           "attempts made (and the retry budget counted)"),
    Anchor("pools/pool.py", "if not self._track_views:", "before", "the attempt's callable built"),
    Anchor("core/failover.py", ("token, index = attempts.enter()", "index = attempts.enter()"), "before",
           "run_sync entered", nth=0),
    Anchor("core/failover.py", "if not DIRECT_FIRST_ATTEMPT:", "before",
           "feature: driver-log marker set (ContextVar; none since 2026-12-07's last stop)"),
    Anchor("core/failover.py", "failure: BaseException | None = None", "before",
           "feature: load accounting, attempt started", nth=0),
    Anchor("pools/_watchdog.py", "value: T = call(entry.index, entry.query_id)", "before",
           "feature: watchdog entry registered"),
    Anchor("pools/pool.py", "result = getattr(client, method)(*call.args, **call.kwargs)", "before",
           "the attempt's run: client looked up"),
    Anchor("pools/pool.py", "result = getattr(client, method)(*call.args, **call.kwargs)", "after",
           "CLIENT: its request and answer"),
    Anchor("pools/_leftovers.py", "return result", "before", "CLIENT: result read (settled)"),
    Anchor("pools/_watchdog.py", "value: T = call(entry.index, entry.query_id)", "after",
           "run returned into the watchdog"),
    Anchor("pools/_watchdog.py", "return value", "before", "feature: watchdog entry ended", nth=0),
    Anchor("core/failover.py", "self._balancer.record_success(index if self.answered_by is None else self.answered_by)",
           "before", "feature: load accounting, attempt finished", nth=1),
    Anchor("core/failover.py", "self._balancer.record_success(index if self.answered_by is None else self.answered_by)",
           "after", "success recorded", nth=1),
    Anchor("pools/pool.py", "return run_sync(attempts, attempt, self._policy)", "after",
           "feature: driver-log marker reset, back in _call", nth=0),
]


def instrument(tree: Path, into: Path) -> Path:
    """A copy of ``tree``'s clickhouse_lb under ``into`` with the marks of :data:`ANCHORS`."""
    package = into / "clickhouse_lb"
    shutil.copytree(tree / "clickhouse_lb", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "_segment_marks.py").write_text(MARKS_MODULE)
    sources: dict[str, list[str]] = {}
    for number, anchor in enumerate(ANCHORS):
        lines = sources.setdefault(anchor.file, (package / anchor.file).read_text().splitlines())
        wanted_lines = (anchor.line,) if isinstance(anchor.line, str) else anchor.line
        found = [i for i, text in enumerate(lines) if text.strip() in wanted_lines]
        wanted = 1 if anchor.nth is None else anchor.nth + 1
        if len(found) != wanted and (anchor.nth is None or len(found) < wanted):
            raise SystemExit(f"anchor {anchor.line!r} of {anchor.file}: found {len(found)} times, not as "
                             "expected; update ANCHORS in bench/real_mix_segments.py")
        at = found[wanted - 1]
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        if lines[at].lstrip().startswith("return ") and anchor.where == "after":
            # ``return f(...)``: the value kept, the mark put, then returned.
            expression = lines[at].strip()[len("return "):]
            lines[at:at + 1] = [f"{indent}_r = {expression}", f"{indent}_M.append(({number}, _now()))",
                                f"{indent}return _r"]
            continue
        mark = f"{indent}_M.append(({number}, _now()))"
        lines.insert(at if anchor.where == "before" else at + 1, mark)
    for file, lines in sources.items():
        text = "\n".join(lines) + "\n"
        head = "from __future__ import annotations\n"
        text = text.replace(head, head + IMPORT_MARKS, 1) if head in text else IMPORT_MARKS + text
        (package / file).write_text(text)
    return into


def worker(n: int, rounds: int, strategy: str) -> None:
    """Run the real mix on the instrumented copy (on ``sys.path``) and print the segments."""
    sys.path.insert(0, str(HERE))
    from headtohead.contenders import open_scrambler

    from clickhouse_lb import get_pool
    from clickhouse_lb.testing import LocalCluster

    marks: list[tuple[int, float]] = importlib.import_module("clickhouse_lb._segment_marks").M  # (the copy's own)

    rng = random.Random(n)
    per_round: list[dict[Any, float]] = []
    with LocalCluster(replicas=3) as cluster:
        scramblers = [open_scrambler(address) for address in cluster.hosts]
        pool = get_pool(cluster.hosts, load_balancing=strategy, share_state=False)
        try:
            for _ in range(rounds):
                segments: dict[Any, list[float]] = {}
                for i in range(n + 30):
                    scramblers[rng.randrange(len(scramblers))].query("SELECT 1")
                    marks.clear()
                    start = time.perf_counter()
                    pool.query("SELECT 1")
                    end = time.perf_counter()
                    if i < 30:
                        continue  # (warming up)
                    previous = start
                    for number, at in [*marks, ("returned to the caller", end)]:
                        segments.setdefault(number, []).append((at - previous) * 1e6)
                        previous = at
                per_round.append({key: statistics.median(values) for key, values in segments.items()})
        finally:
            pool.close()
            for scrambler in scramblers:
                scrambler.close()
    print(f"pool.query('SELECT 1') in the real mix ({strategy}), median of {n} per segment (us), rounds: {rounds}; "
          f"load average {os.getloadavg()[0]:.1f}")
    totals = {"core": [0.0] * rounds, "feature": [0.0] * rounds, "client": [0.0] * rounds}
    for key in per_round[0]:
        name = ANCHORS[key].name if isinstance(key, int) else key
        group = "client" if name.startswith("CLIENT") else "feature" if name.startswith("feature") else "core"
        values = [figures.get(key, 0.0) for figures in per_round]
        for r, value in enumerate(values):
            totals[group][r] += value
        print(f"  {' / '.join(f'{v:6.1f}' for v in values)}  {name}")
    print("sums of the medians:")
    for group, values in totals.items():
        label = {"core": "the pool's core steps", "feature": "the pool's features",
                 "client": "the client's work"}[group]
        print(f"  {' / '.join(f'{v:6.1f}' for v in values)}  {label}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=HERE.parent, help="the checkout whose clickhouse_lb is measured")
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--strategy", default="in_order", help="the pool's load_balancing (default in_order)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.n, args.rounds, args.strategy)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        instrument(args.tree.resolve(), Path(scratch))
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join([scratch, str(HERE)])}
        return subprocess.call([sys.executable, __file__, "--worker", "--n", str(args.n),
                                "--rounds", str(args.rounds), "--strategy", args.strategy], env=environment)


if __name__ == "__main__":
    raise SystemExit(main())
