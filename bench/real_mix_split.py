"""Where the real mix's pool-own time goes: before the client's call, after it, and what a cold
Python frame or object costs on the same machine, against a real LocalCluster.

``bench/compare.py`` reports the pool's own time per statement in the real mix (about 110 us on
a quiet 2-core machine, against a 60 us target): each ``SELECT 1`` is measured after an
unmeasured query to a random replica, so the pool's code and data are met cold. This splits that
figure where it falls and gives the controls that say what a cold path costs per part:

- **pool**: ``pool.query`` (``in_order``, every other setting its default), split at the client's
  call: the time from the pool's entry to the client's ``query``, and from its return (the
  result read) to the pool's return;
- **dispatch only**: the same pool object with its ``_call`` replaced by a one-line hand-over to
  replica 0's client (the statement method's frame and one more: the floor of any pool);
- **20 frames**: a chain of 20 trivial Python functions (one module) around the same client call;
- **20 objects**: the same chain, each function reading five attributes (an int, a list's item,
  a dict's item) of an object of its own, as ``__dict__`` instances and as ``__slots__`` ones.

Medians of ``--n`` statements per part, each part measured in ``--rounds`` interleaved rounds.
The two controls separate "a statement runs many functions" from "a statement touches many
objects": only the second is expensive cold (2026-12-07's figures in BENCHMARKS.md).

    PYTHONPATH=<tree> python bench/real_mix_split.py [--n 400] [--rounds 2]
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SELECT_1 = "SELECT 1"
CHAIN = 20


class _MarkedClient:
    """A clickhouse-connect client that notes when each ``query`` starts and when it has read
    its result (the reading is the client's work whoever triggers it, as in compare.py)."""

    def __init__(self, client: Any, marks: list[float]) -> None:
        self._client = client
        self._marks = marks

    def query(self, *args: Any, **kwargs: Any) -> Any:
        self._marks.append(time.perf_counter())
        result = self._client.query(*args, **kwargs)
        _ = result.result_set
        self._marks.append(time.perf_counter())
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _chain_module(directory: Path) -> Any:
    """Write and import a module of the controls' chains (generated: 20 distinct functions and
    objects, as a pool's path has distinct ones, not one function called 20 times)."""
    lines = [
        "class Plain:",
        "    def __init__(self, i):",
        "        self.a, self.b, self.c, self.d, self.e = i, i + 1, i + 2, [i], {'k': i}",
        "class Slotted:",
        "    __slots__ = ('a', 'b', 'c', 'd', 'e')",
        "    def __init__(self, i):",
        "        self.a, self.b, self.c, self.d, self.e = i, i + 1, i + 2, [i], {'k': i}",
        f"PLAIN = [Plain(i) for i in range({CHAIN})]",
        f"SLOTTED = [Slotted(i) for i in range({CHAIN})]",
    ]
    for i in range(CHAIN):
        last = i == CHAIN - 1
        lines += [f"def frame{i}(call):", f"    return {'call()' if last else f'frame{i + 1}(call)'}"]
        for kind, objects in (("plain", "PLAIN"), ("slotted", "SLOTTED")):
            lines += [
                f"def {kind}{i}(call):",
                f"    o = {objects}[{i}]",
                "    _ = o.a + o.b + o.c + o.d[0] + o.e['k']",
                f"    return {'call()' if last else f'{kind}{i + 1}(call)'}",
            ]
    (directory / "_cold_chain.py").write_text("\n".join(lines) + "\n")
    sys.path.insert(0, str(directory))
    import _cold_chain

    return _cold_chain


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import clickhouse_connect
    from headtohead.contenders import CLIENT_OPTIONS, open_scrambler

    from clickhouse_lb import ReplicaPool, get_pool
    from clickhouse_lb.testing import LocalCluster

    rng = random.Random(args.n)
    figures: dict[str, list[float]] = {}

    def measure(name: str, call: Callable[[], Any], marks: list[float], split: bool = False) -> None:
        for _ in range(30):
            call()
        before, after, own = [], [], []
        for _ in range(args.n):
            scramblers[rng.randrange(len(scramblers))].query(SELECT_1)
            marks.clear()
            start = time.perf_counter()
            call()
            end = time.perf_counter()
            before.append(marks[0] - start)
            after.append(end - marks[1])
            own.append(end - start - (marks[1] - marks[0]))
        figures.setdefault(name, []).append(statistics.median(own) * 1e6)
        if split:
            figures.setdefault(f"{name}: before the client's call", []).append(statistics.median(before) * 1e6)
            figures.setdefault(f"{name}: after it", []).append(statistics.median(after) * 1e6)

    with tempfile.TemporaryDirectory() as scratch, LocalCluster(replicas=3) as cluster:
        chain = _chain_module(Path(scratch))
        scramblers = [open_scrambler(address) for address in cluster.hosts]
        host, _, port = cluster.hosts[0].rpartition(":")
        for _ in range(args.rounds):
            for dispatch_only in (False, True):
                marks: list[float] = []
                config = get_pool(cluster.hosts, connect_on_create=False, load_balancing="in_order",
                                  share_state=False).config
                pool = ReplicaPool(config, client_factory=lambda marks=marks, **options: _MarkedClient(
                    clickhouse_connect.get_client(**options), marks))
                try:
                    if dispatch_only:
                        pool.query(SELECT_1)  # (replica 0's client made)
                        client = pool._view.slots[0].client

                        def hand_over(method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                                      client: Any = client) -> Any:
                            return getattr(client, method)(*args, **kwargs)

                        pool._call = hand_over
                    measure("dispatch only" if dispatch_only else "pool", functools.partial(pool.query, SELECT_1),
                            marks, split=not dispatch_only)
                finally:
                    pool.close()
            marks = []
            bare = _MarkedClient(clickhouse_connect.get_client(host=host, port=int(port), **CLIENT_OPTIONS), marks)

            def once(bare: Any = bare) -> Any:
                return bare.query(SELECT_1)

            try:
                measure("a bare client's call (the floor)", once, marks)
                measure(f"{CHAIN} frames", functools.partial(chain.frame0, once), marks)
                measure(f"{CHAIN} frames, an object each", functools.partial(chain.plain0, once), marks)
                measure(f"{CHAIN} frames, a slotted object each", functools.partial(chain.slotted0, once), marks)
            finally:
                bare.close()
        for scrambler in scramblers:
            scrambler.close()
    print(f"pool's own time per statement, median of {args.n} per round, us (rounds: {args.rounds}); "
          f"load average {os.getloadavg()[0]:.1f}")
    for name, values in figures.items():
        print(f"  {name:45s} {' / '.join(f'{v:6.1f}' for v in values)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
