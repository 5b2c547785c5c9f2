"""bench/compare.py's pure parts: the HAProxy config it writes, the summaries, the Markdown
report and the charts, on synthetic data (the benchmark itself needs minutes and is not run here)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from headtohead import analysis, contenders, haproxy, report  # noqa: E402
from headtohead.load import Outcome  # noqa: E402
from headtohead.scenarios import SCENARIOS, Scenario  # noqa: E402

SERVERS = [("r1", "127.0.0.11:9001"), ("r2", "127.0.0.12:9002"), ("r3", "127.0.0.13:9003")]


def _sections(cfg: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = ""
    for line in cfg.splitlines():
        if line and not line.startswith(" "):
            current = line.strip()
            sections[current] = []
        elif line.strip():
            sections[current].append(line.strip())
    return sections


def test_haproxy_config_has_one_frontend_and_checked_backend_per_profile() -> None:
    cfg = haproxy.haproxy_config(haproxy.PROFILES, SERVERS, [7001, 7002, 7003])
    sections = _sections(cfg)
    for profile, port in zip(haproxy.PROFILES, [7001, 7002, 7003]):
        assert sections[f"frontend fe_{profile.name}"] == [
            f"bind 127.0.0.1:{port}", f"default_backend be_{profile.name}"]
        backend = sections[f"backend be_{profile.name}"]
        assert f"balance {profile.balance}" in backend
        assert "option httpchk GET /ping" in backend
        servers = [line for line in backend if line.startswith("server ")]
        assert servers == [f"server {n} {a} {profile.server_options}" for n, a in SERVERS]


def test_haproxy_default_profile_keeps_haproxy_defaults_and_tuned_one_redispatches() -> None:
    sections = _sections(haproxy.haproxy_config(haproxy.PROFILES, SERVERS, [1, 2, 3]))
    default = sections["backend be_haproxy_default"]
    assert not any(line.startswith(("option redispatch", "retries", "timeout", "retry-on")) for line in default)
    assert all(line.endswith(" check") for line in default if line.startswith("server "))
    tuned = sections["backend be_haproxy_tuned"]
    for line in ("option redispatch", "retries 2", "timeout connect 200ms", "timeout server 1s"):
        assert line in tuned
    assert "inter 200ms" in haproxy.TUNED.server_options
    assert "balance leastconn" in sections["backend be_haproxy_leastconn"]
    assert sections["defaults"][0] == "mode http"


def test_haproxy_config_refuses_ports_that_do_not_match_profiles() -> None:
    with pytest.raises(ValueError, match="one port per profile"):
        haproxy.haproxy_config(haproxy.PROFILES, SERVERS, [1])
    with pytest.raises(ValueError, match="no servers"):
        haproxy.haproxy_config(haproxy.PROFILES, [], [1, 2, 3])


def test_ratio_summary_claims_a_difference_only_when_three_quarters_of_rounds_agree() -> None:
    reference = [1.0] * 8
    slower = analysis.ratio_summary([1.1, 1.2, 1.1, 1.15, 1.1, 0.9, 1.1, 1.2], reference)
    assert slower.verdict() == 1
    assert slower.median == pytest.approx(1.1)
    noisy = analysis.ratio_summary([1.3, 0.7, 1.2, 0.8, 1.1, 0.9, 1.0, 1.05], reference)
    assert noisy.verdict() == 0
    faster = analysis.ratio_summary([0.9] * 7 + [1.2], reference)
    assert faster.verdict() == -1
    with pytest.raises(ValueError, match="same non-zero number of rounds"):
        analysis.ratio_summary([1.0], [1.0, 2.0])


def test_error_kind_keeps_the_http_status_of_a_proxy_answer() -> None:
    from headtohead.load import error_kind

    assert error_kind(RuntimeError("HTTP driver received HTTP status 503, server response: ...")) == \
        "RuntimeError HTTP 503"
    assert error_kind(TimeoutError("read timed out")) == "TimeoutError"


def test_throughput_bins_count_each_replica_and_failures_per_bin() -> None:
    outcomes = [Outcome(0, 0.0, 0.05, "r1"), Outcome(0, 0.05, 0.08, "r1"), Outcome(1, 0.0, 0.15, "r2"),
                Outcome(1, 0.15, 0.25, None, "OperationalError"), Outcome(0, 0.1, 9.0, "r1")]
    bins = analysis.throughput_bins(outcomes, ["r1", "r2"], end=0.3)
    assert bins == {"r1": [20.0, 0.0, 0.0], "r2": [0.0, 10.0, 0.0], "failed": [0.0, 0.0, 10.0]}


def test_worst_gap_is_the_longest_wait_for_a_success_in_any_thread() -> None:
    outcomes = [
        Outcome(0, 0.0, 0.1, "r1"), Outcome(0, 0.1, 0.2, "r2"),
        Outcome(1, 0.0, 0.1, "r1"), Outcome(1, 0.1, 1.0, None, "Timeout"), Outcome(1, 1.0, 1.6, "r2"),
    ]
    assert analysis.worst_gap(outcomes) == pytest.approx(1.5)
    assert analysis.worst_gap([Outcome(0, 0.0, 2.0, None, "X")]) == pytest.approx(2.0)


def test_readmit_delay_counts_only_statements_sent_after_the_replica_is_back() -> None:
    outcomes = [Outcome(0, 1.0, 5.2, "r1"),  # stuck on the paused replica, answered after resume
                Outcome(1, 5.5, 5.6, "r2"), Outcome(1, 5.8, 5.9, "r1")]
    assert analysis.readmit_delay(outcomes, "r1", back_at=5.0) == pytest.approx(0.8)
    assert analysis.readmit_delay(outcomes[:2], "r1", back_at=5.0) is None


def test_waiting_at_finds_statements_stuck_on_a_hung_replica() -> None:
    outcomes = [Outcome(0, 1.5, 3.1, "r1"), Outcome(1, 1.6, 1.7, "r2"), Outcome(2, 0.5, 0.6, "r1"),
                Outcome(3, 2.9, 3.2, "r1"), Outcome(3, 3.3, 3.4, "r1"), Outcome(2, 0.9, 3.0, "r1"),
                Outcome(1, 1.8, 3.5, "r2")]
    # sent before the resume at 3.0, answered by r1 at or after it (sent at 0.9: while being stopped)
    assert analysis.waiting_at(outcomes, "r1", 3.0) == [outcomes[0], outcomes[3], outcomes[5]]


def test_timeline_summary_tells_a_stopped_replica_the_balancer_kept_using_from_a_killed_one() -> None:
    events = {"fault": 1.0, "recover": 3.0, "back": 3.5, "end": 6.0}
    paused = [Outcome(0, 0.5, 0.6, "r1"), Outcome(0, 1.1, 3.6, "r1"), Outcome(1, 2.5, 3.6, "r1"),
              Outcome(2, 1.2, 1.3, "r2"), Outcome(2, 3.8, 3.9, "r1")]
    summary = analysis.summarize_timeline(paused, {**events, "recover": 3.5}, "pause", "r1")
    assert (summary["stuck"], summary["never_left"]) == (2, True)
    assert summary["readmit"] == pytest.approx(0.3)
    assert summary["worst_gap"] == pytest.approx(3.6)  # thread 1: from the start of the load to 3.6
    # a killed replica answers a statement sent while its restart is under way: not "stuck"
    killed = [Outcome(0, 0.5, 0.6, "r1"), Outcome(0, 3.2, 3.3, "r1"), Outcome(1, 1.5, 1.6, "r2")]
    # every thread stuck on r1 from the start: nothing could be sent later, it never left either
    blackout = [Outcome(0, 0.99, 3.55, "r1"), Outcome(1, 1.05, 3.55, "r1"), Outcome(1, 3.6, 3.7, "r1")]
    summary = analysis.summarize_timeline(blackout, {**events, "recover": 3.5}, "pause", "r1")
    assert (summary["stuck"], summary["never_left"]) == (2, True)
    # stuck early, then routed away for the rest of the stop: it left rotation
    left = [*blackout[:1], Outcome(1, 1.0, 1.3, "r2"), Outcome(1, 2.5, 2.6, "r3"), Outcome(1, 3.6, 3.7, "r1")]
    summary = analysis.summarize_timeline(left, {**events, "recover": 3.5}, "pause", "r1")
    assert (summary["stuck"], summary["never_left"], summary["readmit"]) == (1, False, pytest.approx(0.1))
    summary = analysis.summarize_timeline(killed, events, "kill", "r1")
    assert (summary["stuck"], summary["never_left"], summary["readmit"]) == (0, False, None)
    assert summary["window_after_back"] == pytest.approx(2.5)


def test_replica_shares_ignore_failures() -> None:
    outcomes = [Outcome(0, 0, 1, "r2"), Outcome(0, 0, 1, "r3"), Outcome(0, 0, 1, "r3"), Outcome(0, 0, 1, None, "E")]
    assert analysis.replica_shares(outcomes, ["r1", "r2", "r3"]) == pytest.approx({"r1": 0, "r2": 1 / 3, "r3": 2 / 3})
    assert analysis.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert analysis.percentile([3.0, 1.0, 2.0, 4.0], 99) == 4.0


def test_an_haproxy_contender_without_haproxy_says_why() -> None:
    haproxy_contender = contenders.by_name("haproxy_tuned")
    assert "haproxy not on PATH" in str(contenders.available(haproxy_contender, haproxy_present=False))
    assert contenders.available(haproxy_contender, haproxy_present=True) is None
    assert contenders.available(contenders.by_name("pool_hedged"), haproxy_present=False) is None
    with pytest.raises(KeyError, match="unknown contender"):
        contenders.by_name("nope")


def _pool_of(name: str) -> Any:
    import clickhouse_lb

    c = contenders.by_name(name)
    assert c.kind == "pool"
    assert c.strategy is not None
    return clickhouse_lb.get_pool(["127.0.0.1:9", "127.0.0.1:10"], connect_on_create=False,
                                  **contenders.pool_arguments(c.strategy, c.options))


def test_every_pool_contender_builds_with_its_own_state() -> None:
    """A misspelt keyword fails here, not minutes into a run; and no pool shares its balancing
    state (nor a probe worker outliving close()) with the contender before it."""
    for c in contenders.CONTENDERS:
        if c.kind == "pool":
            pool = _pool_of(c.name)
            try:
                assert pool.config.share_state is False, c.name
            finally:
                pool.close()


def test_the_failover_control_is_the_pool_without_probes_or_liveness_checks() -> None:
    plain, default, hedged = (_pool_of(n) for n in ("pool_random_no_checks", "pool_random", "pool_hedged"))
    try:
        assert not plain.config.health.enabled
        assert plain.config.attempts.liveness.check_after is None
        assert default.config.health.enabled
        assert default.config.attempts.liveness.check_after is not None
        assert not default.config.attempts.hedging.enabled
        assert hedged.config.attempts.hedging.enabled
    finally:
        for pool in (plain, default, hedged):
            pool.close()
    for scenario in SCENARIOS:
        if scenario.kind == "timeline":
            assert {"pool_random", "pool_random_no_checks"} <= set(scenario.contenders), scenario.name


def test_every_scenario_names_known_contenders() -> None:
    for scenario in SCENARIOS:
        assert isinstance(scenario, Scenario)
        for name in scenario.contenders:
            assert contenders.by_name(name).name == name


def _outcomes(replicas: list[str], end: float, fail_between: tuple[float, float]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    t = 0.0
    i = 0
    while t < end:
        failed = fail_between[0] <= t < fail_between[1] and i % 7 == 0
        rows.append([i % 4, t, t + 0.01, None if failed else replicas[i % len(replicas)],
                     "OperationalError" if failed else None])
        t += 0.01
        i += 1
    return rows


def synthetic_results() -> dict[str, Any]:
    replicas = ["r1", "r2", "r3"]
    names = ["bare", "bare_random", "pool_random", "haproxy_tuned"]
    cells = ["select1/1", "mid/1", "select1/8", "mid/8"]
    # every round: bare 1 ms, bare_random 1.25 ms, pool_random 1.375 ms (1.1x its control), haproxy 1.5 ms
    factors = {"bare": 1.0, "bare_random": 1.25, "pool_random": 1.375, "haproxy_tuned": 1.5}
    values = {cell: {n: [0.001 * factors[n]] * 4 for n in names} for cell in cells}
    run = {"events": {"fault": 1.0, "recover": 2.0, "back": 2.5, "end": 4.0},
           "outcomes": _outcomes(replicas, 4.0, (1.0, 1.2)),
           "summary": {"statements": 380, "failed": 3, "errors": {"OperationalError": 3}, "worst_gap": 0.21,
                       "readmit": None, "window_after_back": 1.5}}
    shares = {"shares": {"r1": 0.0, "r2": 0.5, "r3": 0.5}, "statements": 100, "throughput": 50.0, "failed": 0,
              "p50": 0.004, "p99": 0.02}
    return {
        "environment": {"date": "2026-11-30 01:00 UTC", "machine": "2 cores, Linux x86_64", "python": "3.11",
                        "clickhouse_connect": "1.12", "chdb": "26.9.0", "clickhouse_lb": "0.1.0",
                        "haproxy": "HAProxy version 2.6", "load_before": [3.5, 2, 1], "load_after": [4.25, 3, 2],
                        "mode": "quick", "note": ""},
        "profiles": {p.name: p.description for p in haproxy.PROFILES},
        "scenarios": [
            {"name": "latency", "kind": "latency", "title": "Per-statement cost", "fault": None,
             "not_run": {"haproxy_default": "no HAProxy in this run: haproxy not on PATH, or --no-haproxy"},
             "cells": cells, "values": values,
             "controls": {"bare": None, "bare_random": None, "pool_random": "bare_random",
                          "haproxy_tuned": "bare_random"},
             "python_work_us": {"random": 15.0}, "own_time_us": {"random": 40.0, "floor": 10.0}},
            {"name": "kill_restart", "kind": "timeline", "title": "r1 killed", "fault": "kill", "not_run": {},
             "runs": {"pool_random": [run], "haproxy_tuned": [run]}, "replicas": replicas, "threads": 4},
            {"name": "pause_resume", "kind": "timeline", "title": "r1 paused", "fault": "pause", "not_run": {},
             "runs": {"pool_random": [{**run, "summary": {**run["summary"], "stuck": 5, "never_left": True}}]},
             "replicas": replicas, "threads": 4},
            {"name": "spread_one_down", "kind": "spread", "title": "r1 down", "fault": None, "not_run": {},
             "results": {"pool_in_order": shares}, "replicas": replicas, "threads": 4, "seconds_each": 2.0},
            {"name": "one_slow_replica", "kind": "slow", "title": "r1 slow", "fault": None, "not_run": {},
             "results": {"pool_random": shares}, "replicas": replicas, "threads": 8, "delay": 0.05,
             "seconds_each": 2.0},
        ],
    }


def test_markdown_report_shows_every_scenario_the_stamp_and_what_was_not_run() -> None:
    text = report.markdown(synthetic_results())
    assert "2026-11-30 01:00 UTC" in text
    assert "load avg 3.5 before, 4.2 after" in text
    # 1 thread: ratio to one bare client; 8 threads: to 3 bare clients picked at random
    row = "| pool_random | 1.38 ms · 1.38x (1.38-1.38) | 1.38 ms · 1.38x (1.38-1.38) | 1.38 ms · 1.10x (1.10-1.10) |"
    assert row in text
    assert "| pool_random | bare_random | 1.10x (1.10-1.10) |" in text
    assert "- pool_random vs bare_random: SELECT 1, 1 thread: slower, 10% (1.10-1.10x)" in text
    assert "random 15 us (1.5% of a bare SELECT 1 here)" in text
    assert "random 40 us (3.0% of a bare SELECT 1 once the floor is taken off)" in text
    assert "(its floor): 10 us." in text
    assert "| pool_random | 380 | 3 (OperationalError: 3) | 0.21 s | 0 | not within 2 s |" in text
    assert "| pool_random | 380 | 3 (OperationalError: 3) | 0.21 s | 5 | never left rotation |" in text
    assert "| pool_in_order | 100 | 0 | 20.00 ms | 0% | 50% | 50% |" in text
    assert "| pool_random | 50 | 4.00 ms | 20.00 ms | 0 | 0% | 50% | 50% |" in text
    assert "Not run: `haproxy_default` (no HAProxy in this run: haproxy not on PATH, or --no-haproxy)." in text


def test_markdown_for_benchmarks_links_each_chart_once_under_deeper_headings() -> None:
    text = report.markdown(synthetic_results(), heading="####", images="docs/img/")
    assert "#### r1 killed (`kill_restart`)" in text
    assert "\n### " not in text
    links = [line for line in text.splitlines() if line.startswith("![")]
    assert links == [
        "![Time per statement relative to bare clients](docs/img/compare-latency.png)",
        "![Replica killed and restarted under load](docs/img/compare-kill-restart.png)",
        "![Replica stopped and resumed under load](docs/img/compare-pause-resume.png)",
        "![Load shares with a replica down, and with one slow replica](docs/img/compare-shares.png)",
    ]
    # the shares chart follows the last scenario it draws
    assert text.rstrip().endswith(links[-1])
    assert "![" not in report.markdown(synthetic_results())


def test_charts_render_every_figure_as_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the bench extra (matplotlib) is not installed")
    from headtohead import charts

    paths = charts.render_all(synthetic_results(), tmp_path)
    assert sorted(p.name for p in paths) == [
        "compare-kill-restart.png", "compare-latency.png", "compare-pause-resume.png", "compare-shares.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 10_000


def test_compare_renders_a_saved_run_without_measuring(tmp_path: Path) -> None:
    import json

    import compare

    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(synthetic_results()))
    block = tmp_path / "benchmarks.md"
    assert compare.main(["--render", str(saved), "--out", str(tmp_path / "out"), "--markdown", str(block)]) == 0
    text = (tmp_path / "out" / "results.md").read_text()
    assert "#### r1 paused (`pause_resume`)" in block.read_text()
    assert "### r1 paused (`pause_resume`)" in text
    # the summaries are recomputed from the outcomes: 4 s of statements, r1 never answered after 2.5 s
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    run = data["scenarios"][1]["runs"]["pool_random"][0]
    assert run["summary"]["statements"] == sum(1 for row in run["outcomes"] if row[4] is None)
    assert (tmp_path / "out" / "compare-latency.png").exists()


def test_compare_refuses_an_unknown_scenario_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    import compare

    with pytest.raises(SystemExit) as exc:
        compare.main(["--only", "latency,nope", "--out", "/nonexistent/never-created"])
    assert exc.value.code == 2
    assert "unknown scenario(s) nope; valid: latency, kill_restart" in capsys.readouterr().err
