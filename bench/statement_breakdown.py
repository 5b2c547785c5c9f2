"""Where one statement's pool work goes, per function: calls and bytecodes, not seconds.

The companion of ``bench/callgrind_statement_cost.py`` (same targets, same fake transport):
callgrind gives the pool's own instructions per statement as one number, because every Python
function runs inside ``_PyEval_EvalFrameDefault``. This script splits that number by Python
function, deterministically: for N statements of each kind through the pool and through the
bare client, it counts per function the calls (Python and C, ``sys.setprofile``) and the
bytecodes executed in the function's own frame (``sys.settrace`` with opcode events), and
prints the pool's minus the bare client's, largest first. Both counts repeat exactly on a
loaded machine. Instructions per bytecode vary (a call or a dict build costs more than a
load), so read the bytecodes as the share of the work, and callgrind as its size.

    python bench/statement_breakdown.py [--n 50] [--kind query] [--top 25]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from callgrind_statement_cost import HOSTS, KINDS, install_fake_transport, make_target, statements

Key = tuple[str, str]


def _where(code: CodeType) -> Key:
    path = code.co_filename
    for marker in ("clickhouse_lb/", "clickhouse_connect/", "urllib3/", "tenacity/", "python3.11/"):
        at = path.rfind(marker)
        if at >= 0:
            path = path[at:]
            break
    return path, f"{code.co_qualname}:{code.co_firstlineno}"


def count(target: Any, kind: str, n: int) -> tuple[Counter[Key], Counter[Key]]:
    """Bytecodes (own frame) and calls per function, for ``n`` statements of ``kind``."""
    call = statements(target)[kind]
    for _ in range(20):
        call()
    bytecodes: Counter[Key] = Counter()
    calls: Counter[Key] = Counter()
    keys: dict[CodeType, Key] = {}

    def key(code: CodeType) -> Key:
        found = keys.get(code)
        if found is None:
            found = keys[code] = _where(code)
        return found

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            bytecodes[key(frame.f_code)] += 1
        return trace

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            calls[key(frame.f_code)] += 1
        elif event == "c_call":
            calls[("<C>", getattr(arg, "__qualname__", repr(arg)))] += 1

    sys.settrace(trace)
    sys.setprofile(profile)
    try:
        for _ in range(n):
            call()
    finally:
        sys.setprofile(None)
        sys.settrace(None)
    return bytecodes, calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--kind", choices=KINDS, default="query")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    install_fake_transport()
    import clickhouse_lb

    pool, bare = make_target("pool", HOSTS), make_target("bare", HOSTS)
    pool_codes, pool_calls = count(pool, args.kind, args.n)
    bare_codes, bare_calls = count(bare, args.kind, args.n)
    pool.close()
    codes = Counter(pool_codes)
    codes.subtract(bare_codes)
    calls = Counter(pool_calls)
    calls.subtract(bare_calls)
    n = args.n
    print(f"clickhouse_lb from {Path(clickhouse_lb.__file__).parent}; {args.kind}; N={n}; per statement, "
          "pool minus bare client")
    print(f"bytecodes: {sum(codes.values()) / n:,.0f}  calls: {sum(calls.values()) / n:,.0f}  "
          f"(of which in clickhouse_lb: {sum(v for k, v in codes.items() if 'clickhouse_lb/' in k[0]) / n:,.0f} "
          f"bytecodes, {sum(v for k, v in calls.items() if 'clickhouse_lb/' in k[0]) / n:,.0f} calls)")
    print("| function | file | bytecodes | calls |")
    print("|---|---|---:|---:|")
    shown = sorted({*codes, *calls}, key=lambda k: (-abs(codes[k]), -abs(calls[k]), k))
    for where in shown[: args.top]:
        if not codes[where] and not calls[where]:
            break
        print(f"| `{where[1]}` | {where[0]} | {codes[where] / n:,.1f} | {calls[where] / n:,.1f} |")
    c_calls = sorted((k for k in calls if k[0] == "<C>" and calls[k]), key=lambda k: -abs(calls[k]))
    print("\nC calls (pool minus bare): " + ", ".join(f"{k[1]} {calls[k] / n:g}" for k in c_calls[: args.top]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
