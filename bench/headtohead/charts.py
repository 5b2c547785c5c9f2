"""PNG charts of a run (matplotlib, the ``bench`` extra): the failover timelines, the cost
ratios, and the load shares. Every figure carries the run's stamp (machine, load, date) and a
line on what the noise allows to conclude."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from .analysis import throughput_bins
from .load import unpack_outcome
from .report import CELL_TITLES, SHARES_CHART, chart_file, latency_ratios, readmit_text, reference_for, stamp

__all__ = ["latency_chart", "render_all", "shares_chart", "timeline_chart"]

_REPLICA_COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b")


def _footer(fig: Figure, env: Mapping[str, Any], caveat: str) -> None:
    fig.text(0.01, 0.005, f"{stamp(env)}\n{caveat}", fontsize=7, color="#444444", va="bottom", ha="left",
             wrap=True)


def timeline_chart(scenario: Mapping[str, Any], env: Mapping[str, Any], bin_width: float = 0.1) -> Figure:
    """One panel per contender: statements/s answered by each replica per ``bin_width`` s, failed
    statements as red ticks, the fault as a shaded band (first run of each contender)."""
    runs: Mapping[str, Sequence[Mapping[str, Any]]] = scenario["runs"]
    replicas: list[str] = scenario["replicas"]
    names = list(runs)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 1.9 * len(names) + 1.3), sharex=True, squeeze=False)
    fault = "SIGKILL" if scenario["fault"] == "kill" else "SIGSTOP"
    back = ("restarted (dotted: restart begins; dashed: r1 answers /ping)" if scenario["fault"] == "kill"
            else "SIGCONT (dashed)")
    for ax, name in zip(axes[:, 0], names):
        run = runs[name][0]
        events = run["events"]
        outcomes = [unpack_outcome(row) for row in run["outcomes"]]
        bins = throughput_bins(outcomes, replicas, events["end"], bin_width)
        xs = [i * bin_width for i in range(len(bins[replicas[0]]))]
        for colour, replica in zip(_REPLICA_COLOURS, replicas):
            ax.plot(xs, bins[replica], color=colour, lw=1.1, label=replica)
        failed = [o.end for o in outcomes if not o.ok]
        if failed:
            ax.plot(failed, [0] * len(failed), "|", color="black", ms=12, label=f"failed ({len(failed)})")
        ax.axvspan(events["fault"], events["back"], color="#f4c7c3", alpha=0.6, lw=0)
        ax.axvline(events["fault"], color="#b22222", lw=0.8)
        ax.axvline(events["back"], color="#2e7d32", lw=0.8, ls="--")
        if events["recover"] < events["back"] - 0.05:  # the restart under way (a new process starting)
            ax.axvline(events["recover"], color="#777777", lw=0.6, ls=":")
        s = run["summary"]
        readmit = readmit_text(s)
        stuck = f", {s['stuck']} stuck on r1" if s.get("stuck") else ""
        ax.set_title(f"{name}: {s['failed']} failed{stuck}, worst per-thread gap {s['worst_gap']:.2f} s, "
                     f"r1 back in rotation: {readmit}", fontsize=9, loc="left")
        ax.set_ylabel("statements/s", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.set_ylim(bottom=0)
    axes[0, 0].legend(fontsize=7, loc="upper right", ncol=4)
    axes[-1, 0].set_xlabel(f"seconds (shaded: r1 {fault} until {back})", fontsize=8)
    fig.suptitle(f"{scenario['title']}: throughput per replica per {bin_width * 1000:.0f} ms", fontsize=11)
    _footer(fig, env, "The first run of each contender. On a loaded 2-core machine, gaps and re-admission times "
                      "moved by up to 0.6 s between two runs: differences of seconds (timeouts, check intervals) "
                      "are what this shows, not tenths (the tables give every run).")
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    return fig


def latency_chart(scenario: Mapping[str, Any], env: Mapping[str, Any]) -> Figure:
    """Per cell, each contender's time per statement as a ratio to the cell's reference, with
    the quartiles of the per-round ratios as error bars."""
    cells: list[str] = scenario["cells"]
    ratios = latency_ratios(scenario)
    names = list(scenario["values"][cells[0]])
    fig, axes = plt.subplots(1, len(cells), figsize=(3.6 * len(cells), 4.6), sharey=False, squeeze=False)
    for ax, cell in zip(axes[0], cells):
        ref = reference_for(cell)
        ys, lo, hi, labels = [], [], [], []
        for name in names:
            r = ratios[cell][name]["reference"]
            if r is None:
                continue
            ys.append(r.median)
            lo.append(r.median - r.q1)
            hi.append(r.q3 - r.median)
            labels.append(name)
        colours = ["#7f7f7f" if n.startswith("bare") else "#1f77b4" if n.startswith("pool") else "#ff7f0e"
                   for n in labels]
        pos = range(len(labels))
        ax.barh(list(pos), ys, xerr=[lo, hi], color=colours, alpha=0.85, capsize=2)
        for y, v in zip(pos, ys):
            ax.text(0.03, y, f"{v:.2f}x", va="center", fontsize=7, color="white", fontweight="bold")
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_yticks(list(pos))
        ax.set_yticklabels(labels if ax is axes[0][0] else [""] * len(labels), fontsize=8)
        ax.invert_yaxis()
        widths = [s.q3 - s.q1 for r in ratios[cell].values() if (s := r["reference"]) is not None]
        noise = statistics.median(widths) if widths else float("nan")
        ax.set_title(f"{CELL_TITLES.get(cell, cell)}\nvs {ref} (typical quartile width {noise:.0%})", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_xlim(0, max(y + h for y, h in zip(ys, hi)) * 1.2 if ys else 2)
    rounds = len(next(iter(scenario["values"][cells[0]].values())))
    fig.suptitle("Time per statement relative to bare clients (grey: bare, blue: clickhouse-lb, orange: HAProxy)",
                 fontsize=10)
    _footer(fig, env, f"Bars: median of {rounds} interleaved rounds; whiskers: quartiles of the per-round ratios. "
                      "Bars closer than a panel's typical quartile width are not separated by this run.")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return fig


def shares_chart(scenarios: Sequence[Mapping[str, Any]], env: Mapping[str, Any]) -> Figure:
    """Stacked share of statements per replica for the spread and slow-replica scenarios, with
    throughput and p99 latency in the labels."""
    fig, axes = plt.subplots(1, len(scenarios), figsize=(6 * len(scenarios), 4.2), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios):
        replicas: list[str] = scenario["replicas"]
        results: Mapping[str, Mapping[str, Any]] = scenario["results"]
        names = list(results)
        left = [0.0] * len(names)
        for colour, replica in zip(_REPLICA_COLOURS, replicas):
            widths = [results[n]["shares"][replica] for n in names]
            ax.barh(names, widths, left=left, color=colour, label=replica)
            left = [a + b for a, b in zip(left, widths)]
        for i, n in enumerate(names):
            r = results[n]
            rate = r.get("throughput", r["statements"] / scenario["seconds_each"])
            ax.text(1.01, i, f"{rate:.0f}/s, p99 {r['p99'] * 1e3:.0f} ms", va="center", fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, 1.45)
        ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
        ax.set_xticklabels(["0", "25%", "50%", "75%", "100%"], fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_title(scenario["title"], fontsize=9)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.35, -0.1), ncol=len(replicas))
    _footer(fig, env, "One run of a few seconds per contender: shares are stable to a few percent, throughput "
                      "and p99 vary by 20% or more between runs on a loaded machine.")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig


def render_all(data: Mapping[str, Any], out: Path) -> list[Path]:
    env = data["environment"]
    paths: list[Path] = []

    def save(fig: Figure, name: str) -> None:
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    share_scenarios = []
    for scenario in data["scenarios"]:
        if scenario["kind"] == "latency":
            save(latency_chart(scenario, env), chart_file(scenario))
        elif scenario["kind"] == "timeline" and scenario["runs"]:
            save(timeline_chart(scenario, env), chart_file(scenario))
        elif scenario["kind"] in ("spread", "slow") and scenario["results"]:
            share_scenarios.append(scenario)
    if share_scenarios:
        save(shares_chart(share_scenarios, env), SHARES_CHART)
    return paths
