"""Head to head: bare clickhouse-connect clients, the clickhouse-lb pool and HAProxy, on one
local 3-replica cluster, in one run (see BENCHMARKS.md, "Head to head").

    python bench/compare.py --quick          # about 3 minutes on 2 shared cores
    python bench/compare.py                  # about 10-13 minutes
    python bench/compare.py --only latency,kill_restart --out /tmp/h2h
    python bench/compare.py --out /tmp/h2h --markdown /tmp/h2h/benchmarks.md --note "idle machine"

Starts a LocalCluster and, when ``haproxy`` is on PATH, one HAProxy with a config written here
(default and tuned profiles); without haproxy it says so and runs the rest. Writes
``results.json``, ``results.md`` and PNG charts (matplotlib: ``pip install -e '.[bench]'``;
without it the charts are skipped, said so) to ``--out``; ``--markdown PATH`` also writes the
report as it goes under "A representative run" in BENCHMARKS.md (``####`` headings, a link to
each chart under ``docs/img/``, where the PNGs of ``--out`` are then copied).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from headtohead import report
from headtohead.haproxy import PROFILES, HAProxy, find_haproxy, haproxy_version
from headtohead.scenarios import SCENARIOS, Bench, Sizes


def environment(haproxy_binary: str | None) -> dict[str, Any]:
    import clickhouse_connect

    import clickhouse_lb

    try:
        from importlib.metadata import version

        chdb = version("chdb-core")
    except Exception:
        chdb = "unknown"
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "clickhouse_connect": clickhouse_connect.__version__ if hasattr(clickhouse_connect, "__version__") else "?",
        "clickhouse_lb": clickhouse_lb.__version__,
        "chdb": chdb,
        "haproxy": haproxy_version(haproxy_binary) if haproxy_binary else None,
        "load_before": list(os.getloadavg()),
    }


#: Where the representative run's charts are committed, relative to BENCHMARKS.md.
DOCS_IMAGES = "docs/img"


def write_outputs(data: dict[str, Any], out: Path, log: Callable[[str], None],
                  markdown_path: Path | None = None) -> None:
    """results.json, results.md (also printed) and the charts, in ``out``; with
    ``markdown_path``, the report for BENCHMARKS.md there too."""
    (out / "results.json").write_text(json.dumps(data, indent=1))
    markdown = report.markdown(data)
    (out / "results.md").write_text(markdown)
    print()
    print(markdown)
    if markdown_path is not None:
        markdown_path.write_text(report.markdown(data, heading="####", images=DOCS_IMAGES))
        log(f"report for BENCHMARKS.md: {markdown_path} (its charts link to {DOCS_IMAGES}/: "
            f"copy {out}/compare-*.png there)")
    if importlib.util.find_spec("matplotlib") is None:
        log("charts skipped: matplotlib is not installed (pip install -e '.[bench]')")
        return
    from headtohead import charts

    for path in charts.render_all(data, out):
        log(f"chart: {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter windows (about 3 minutes)")
    parser.add_argument("--only", default="", help=f"comma-separated scenarios: {', '.join(s.name for s in SCENARIOS)}")
    parser.add_argument("--out", default="compare-results", help="output directory (default: ./compare-results)")
    parser.add_argument("--no-haproxy", action="store_true", help="do not start HAProxy even when it is installed")
    parser.add_argument("--note", default="", help="a line about the machine's state, shown on every figure")
    parser.add_argument("--markdown", metavar="PATH", type=Path,
                        help="also write the report for BENCHMARKS.md's \"A representative run\" (#### headings, "
                             f"chart links to {DOCS_IMAGES}/) to PATH")
    parser.add_argument("--render", metavar="RESULTS_JSON",
                        help="measure nothing: write the report and charts of a saved results.json to --out")
    args = parser.parse_args(argv)
    if args.render:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        data = report.resummarize(json.loads(Path(args.render).read_text()))
        write_outputs(data, out, print, args.markdown)
        return 0

    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {s.name for s in SCENARIOS}
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(sorted(unknown))}; valid: {', '.join(s.name for s in SCENARIOS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = Sizes.quick() if args.quick else Sizes.full()

    # Failovers are what is measured here: the pool's and clickhouse-connect's warnings about
    # each one would bury the results.
    for name in ("clickhouse_lb", "clickhouse_connect"):
        logging.getLogger(name).setLevel(logging.CRITICAL)

    def log(line: str) -> None:
        print(line, flush=True)

    binary = None if args.no_haproxy else find_haproxy()
    if args.no_haproxy:
        log("haproxy: not started (--no-haproxy): the HAProxy contenders are not run.")
    elif binary is None:
        log("haproxy: not on PATH: the HAProxy contenders are not run. "
            "Install it (Debian/Ubuntu: apt-get install haproxy) to compare against it.")
    env = environment(binary)
    env["mode"] = "quick" if args.quick else "full"
    env["note"] = args.note
    log(f"{env['date']}; {env['machine']}; load average {env['load_before'][0]:.2f}; mode {env['mode']}")

    from clickhouse_lb.testing import LocalCluster

    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    with LocalCluster(replicas=3) as cluster:
        proxy = HAProxy(binary, list(zip(cluster.names, cluster.hosts)), PROFILES) if binary else None
        try:
            if proxy is not None:
                proxy.start()
                log(f"{env['haproxy']}: " + ", ".join(f"{name} on {port}" for name, port in proxy.ports.items()))
            bench = Bench(cluster, proxy, sizes, log)
            for scenario in chosen:
                results.append(bench.run(scenario))
        finally:
            if proxy is not None:
                proxy.close()
    env["load_after"] = list(os.getloadavg())
    env["seconds"] = time.perf_counter() - started
    data = {"environment": env, "profiles": {p.name: p.description for p in PROFILES}, "scenarios": results}
    write_outputs(data, out, log, args.markdown)
    log(f"done in {env['seconds']:.0f} s; results in {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
