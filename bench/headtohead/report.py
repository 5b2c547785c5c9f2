"""The results as Markdown (pure: a dict in, text out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .analysis import RatioSummary, ratio_summary

__all__ = ["CELL_TITLES", "SHARES_CHART", "chart_file", "latency_ratios", "markdown", "reference_for", "stamp"]

CELL_TITLES = {
    "select1/1": "SELECT 1, 1 thread",
    "mid/1": "20k rows, 1 thread",
    "select1/8": "SELECT 1, 8 threads",
    "mid/8": "20k rows, 8 threads",
}


#: The one chart of every ``spread`` and ``slow`` scenario of a run.
SHARES_CHART = "compare-shares.png"
_CHART_ALT = {
    "latency": "Time per statement relative to bare clients",
    "kill": "Replica killed and restarted under load",
    "pause": "Replica stopped and resumed under load",
    "shares": "Load shares with a replica down, and with one slow replica",
}


def chart_file(scenario: Mapping[str, Any]) -> str:
    """The PNG a scenario is drawn in (:func:`headtohead.charts.render_all` writes it)."""
    if scenario["kind"] == "latency":
        return "compare-latency.png"
    if scenario["kind"] == "timeline":
        return f"compare-{scenario['name'].replace('_', '-')}.png"
    return SHARES_CHART


def _chart_link(scenario: Mapping[str, Any], images: str) -> str:
    key = "shares" if scenario["kind"] in ("spread", "slow") else scenario.get("fault") or scenario["kind"]
    return f"![{_CHART_ALT.get(key, scenario['title'])}]({images.rstrip('/')}/{chart_file(scenario)})"


def reference_for(cell: str) -> str:
    """1 thread: one bare client (to r1); more threads: three bare clients picked at random,
    since one replica alone is not the alternative a user with 3 replicas weighs."""
    return "bare" if cell.endswith("/1") else "bare_random"


def stamp(env: Mapping[str, Any]) -> str:
    """Machine, load and date, for every table and figure."""
    before = env.get("load_before") or [float("nan")]
    after = env.get("load_after") or before
    text = (f"{env.get('date', '?')} · {env.get('machine', '?')} · load avg {before[0]:.1f} before, "
            f"{after[0]:.1f} after · {env.get('mode', '?')} run")
    if env.get("note"):
        text += f" · {env['note']}"
    return text


def latency_ratios(scenario: Mapping[str, Any]) -> dict[str, dict[str, dict[str, RatioSummary | None]]]:
    """Per cell and contender: ratio to the cell's reference and to the contender's control."""
    out: dict[str, dict[str, dict[str, RatioSummary | None]]] = {}
    controls: Mapping[str, str | None] = scenario["controls"]
    for cell in scenario["cells"]:
        values: Mapping[str, Sequence[float]] = scenario["values"][cell]
        ref = values.get(reference_for(cell))
        out[cell] = {}
        for name, vals in values.items():
            control = controls.get(name)
            out[cell][name] = {
                "reference": ratio_summary(vals, ref) if ref else None,
                "control": ratio_summary(vals, values[control]) if control and control in values else None,
            }
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _latency(scenario: Mapping[str, Any]) -> list[str]:
    cells: list[str] = scenario["cells"]
    ratios = latency_ratios(scenario)
    rounds = len(next(iter(scenario["values"][cells[0]].values())))
    lines = [
        f"Time per statement (1 thread: median latency; 8 threads: wall time / statements), median over "
        f"{rounds} interleaved rounds, and the ratio to the reference measured in the same round: median "
        "(quartiles of the per-round ratios). Reference: 1 thread, one bare client to r1; 8 threads, 3 bare clients "
        "picked at random. Below 1.00x is faster.",
        "",
        "| contender | " + " | ".join(CELL_TITLES.get(c, c) for c in cells) + " |",
        "|---|" + "---:|" * len(cells),
    ]
    for name in scenario["values"][cells[0]]:
        row = []
        for cell in cells:
            value = _median(scenario["values"][cell][name])
            ref = ratios[cell][name]["reference"]
            row.append(_ms(value) + (f" · {ref.text()}" if ref is not None and name != reference_for(cell) else ""))
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines += [
        "",
        "The balancing layer's own cost: each contender against bare clients that pick replicas the same "
        "way (pool in_order vs one bare client to r1, pool random vs a random pick, pool round_robin and "
        "HAProxy roundrobin vs a pick in turn).",
        "",
        "| contender | its control | " + " | ".join(CELL_TITLES.get(c, c) for c in cells) + " |",
        "|---|---|" + "---:|" * len(cells),
    ]
    for name, control in scenario["controls"].items():
        if not control or control not in scenario["values"][cells[0]]:
            continue
        summaries = [ratios[cell][name]["control"] for cell in cells]
        lines.append(f"| {name} | {control} | " + " | ".join(s.text() if s else "-" for s in summaries) + " |")
    work = scenario.get("python_work_us") or {}
    if work:
        select1 = _median(scenario["values"]["select1/1"]["bare"]) if "select1/1" in cells else None
        parts = [f"{strategy} {us:.0f} us" + (f" ({us / 1e6 / select1:.1%} of a bare SELECT 1 here)" if select1 else "")
                 for strategy, us in work.items()]
        lines += ["", "The pool's own Python work per statement (over in-process fake clients, no I/O; best of 5): "
                  + ", ".join(parts) + "."]
    own = dict(scenario.get("own_time_us") or {})
    floor = own.pop("floor", None)
    if own and floor is not None:
        select1 = _median(scenario["values"]["select1/1"]["bare"]) if "select1/1" in cells else None
        parts = [f"{strategy} {us:.0f} us" + (f" ({(us - floor) / 1e6 / select1:.1%} of a bare SELECT 1 once the "
                                              "floor is taken off)" if select1 else "")
                 for strategy, us in own.items()]
        lines += ["", "The pool's own time per statement in this run (statement time minus the time inside the "
                  "replica's client, median; between statements the CPU runs the replicas, so caches are cold): "
                  + ", ".join(parts) + f"; the same measure for a bare pass-through call (its floor): {floor:.0f} us."]
    lines += ["", *_latency_conclusions(scenario, ratios)]
    return lines


def _latency_conclusions(scenario: Mapping[str, Any], ratios: Mapping[str, Any]) -> list[str]:
    """What the noise allows: a difference is claimed only when every round agrees on its sign."""
    lines = ["What this run allows to conclude (a difference is claimed only when three quarters of the "
             "rounds agree on its sign):", ""]
    for name, control in scenario["controls"].items():
        if not control or control not in scenario["values"][scenario["cells"][0]]:
            continue
        parts = []
        for cell in scenario["cells"]:
            r: RatioSummary | None = ratios[cell][name]["control"]
            if r is None:
                continue
            title = CELL_TITLES.get(cell, cell)
            verdict = r.verdict()
            if verdict == 0:
                parts.append(f"{title}: no difference measurable ({r.q1:.2f}-{r.q3:.2f}x)")
            elif verdict > 0:
                parts.append(f"{title}: slower, {(r.median - 1) * 100:.0f}% ({r.q1:.2f}-{r.q3:.2f}x)")
            else:
                parts.append(f"{title}: faster, {(1 - r.median) * 100:.0f}% ({r.q1:.2f}-{r.q3:.2f}x)")
        lines.append(f"- {name} vs {control}: " + "; ".join(parts))
    return lines


def readmit_text(summary: Mapping[str, Any]) -> str:
    if summary.get("never_left"):
        return "never left rotation"
    if summary["readmit"] is None:
        return f"not within {summary['window_after_back']:.0f} s"
    return f"{summary['readmit']:.2f} s"


def failed_text(summary: Mapping[str, Any]) -> str:
    """``664 (HTTP 503: 661, OperationalError: 3)``."""
    errors: Mapping[str, int] = summary.get("errors") or {}
    if not summary["failed"] or not errors:
        return str(summary["failed"])
    kinds = ", ".join(f"{kind.replace('OperationalError HTTP', 'HTTP')}: {n}" for kind, n in errors.items())
    return f"{summary['failed']} ({kinds})"


def _timeline(scenario: Mapping[str, Any]) -> list[str]:
    hung = scenario["fault"] == "pause"
    lines = [
        f"{scenario['threads']} threads of `SELECT getMacro('replica')` back to back; r1 "
        + ("SIGSTOPped (hung), then resumed" if hung else "SIGKILLed, then restarted")
        + ". Worst gap: the longest time a thread waited for a statement to succeed. Stuck: statements "
        "held on r1 until it answered again ("
        + ("sent to the stopped replica, answered once it resumed" if hung
           else "a balancer retrying the dead replica until its restart")
        + "). Back in rotation: from the moment r1 answers again to the first statement sent to it after "
        "that; \"never left rotation\": r1 was never taken out (a stuck statement was sent in the second half of "
        "the fault, or every thread was waiting on r1). Several runs are separated by `/`.",
        "",
        "| contender | statements ok | failed | worst per-thread gap | stuck on r1 "
        "| r1 back in rotation after it answers |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, runs in scenario["runs"].items():
        summaries = [r["summary"] for r in runs]
        columns = [
            [str(s["statements"]) for s in summaries],
            [failed_text(s) for s in summaries],
            [f"{s['worst_gap']:.2f} s" for s in summaries],
            [str(s.get("stuck", 0)) for s in summaries],
            [readmit_text(s) for s in summaries],
        ]
        lines.append(f"| {name} | " + " | ".join(" / ".join(column) for column in columns) + " |")
    return lines


def _shares(scenario: Mapping[str, Any], slow: bool) -> list[str]:
    replicas: list[str] = scenario["replicas"]
    if slow:
        head = (f"{scenario['threads']} threads for {scenario['seconds_each']:.0f} s each; r1 answers "
                f"{scenario['delay'] * 1e3:.0f} ms late.")
        cols = "| contender | statements/s | p50 | p99 | failed | " + " | ".join(f"{r} share" for r in replicas) + " |"
    else:
        head = f"{scenario['threads']} threads for {scenario['seconds_each']:.0f} s each; r1 killed before."
        cols = "| contender | statements | failed | p99 | " + " | ".join(f"{r} share" for r in replicas) + " |"
    lines = [head, "", cols, "|---|" + "---:|" * (cols.count("|") - 2)]
    for name, r in scenario["results"].items():
        shares = " | ".join(f"{r['shares'][x]:.0%}" for x in replicas)
        if slow:
            lines.append(f"| {name} | {r['throughput']:.0f} | {_ms(r['p50'])} | {_ms(r['p99'])} | {r['failed']} "
                         f"| {shares} |")
        else:
            lines.append(f"| {name} | {r['statements']} | {r['failed']} | {_ms(r['p99'])} | {shares} |")
    return lines


def resummarize(data: dict[str, Any]) -> dict[str, Any]:
    """Recompute each failover run's summary from its outcomes (a saved run, read again with
    this version's definitions)."""
    from .analysis import summarize_timeline
    from .load import unpack_outcome

    for scenario in data["scenarios"]:
        if scenario["kind"] != "timeline":
            continue
        for runs in scenario["runs"].values():
            for run in runs:
                outcomes = [unpack_outcome(row) for row in run["outcomes"]]
                run["summary"] = summarize_timeline(outcomes, run["events"], scenario["fault"],
                                                    scenario["replicas"][0])
    return data


def markdown(data: Mapping[str, Any], *, heading: str = "###", images: str | None = None) -> str:
    """The report. ``heading``: the Markdown level of each scenario's title; ``images``: when
    given, a link to each scenario's chart under that directory follows its table (the shares
    chart once, after the last scenario it draws), as in BENCHMARKS.md."""
    env = data["environment"]
    lines = [
        f"Run: {stamp(env)}; Python {env.get('python')}, clickhouse-connect {env.get('clickhouse_connect')}, "
        f"chdb-core {env.get('chdb')}, clickhouse-lb {env.get('clickhouse_lb')}, "
        f"{env.get('haproxy') or 'no HAProxy (not on PATH)'}.",
    ]
    if env.get("haproxy"):
        lines += ["", "HAProxy profiles:", ""]
        lines += [f"- `{name}`: {text}" for name, text in data.get("profiles", {}).items()]
    scenarios = data["scenarios"]
    last_shares = max((i for i, s in enumerate(scenarios) if s["kind"] in ("spread", "slow") and s["results"]),
                      default=None)
    for i, scenario in enumerate(scenarios):
        lines += ["", f"{heading} {scenario['title']} (`{scenario['name']}`)", ""]
        kind = scenario["kind"]
        if kind == "latency":
            lines += _latency(scenario)
        elif kind == "timeline":
            lines += _timeline(scenario)
        elif kind in ("spread", "slow"):
            lines += _shares(scenario, slow=kind == "slow")
        if scenario.get("not_run"):
            lines += ["", "Not run: " + "; ".join(f"`{k}` ({v})" for k, v in scenario["not_run"].items()) + "."]
        drawn = scenario.get("runs") if kind == "timeline" else scenario.get("results", True)
        if images is not None and drawn and (kind not in ("spread", "slow") or i == last_shares):
            lines += ["", _chart_link(scenario, images)]
    return "\n".join(lines) + "\n"
