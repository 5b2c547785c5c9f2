"""The ``clickhouse-lb`` command without a server: arguments, ``status`` over fake replicas and
over closed ports, the demo's building blocks (timing, output, claims), exit statuses.
(End to end against a real local cluster: integration/test_cli.py.)"""

from __future__ import annotations

import argparse
import io
import json
import logging
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from clickhouse_lb.cli import _console, _demo, _status
from clickhouse_lb.cli import _main as cli
from clickhouse_lb.cli._main import build_parser, format_table, library_logging, main, run_status, short_error
from clickhouse_lb.config.settings import LoadBalancing
from clickhouse_lb.pools.pool import ReplicaPool

from .fakes import FakeCluster, make_pool, refused, server_error


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["status", *argv])


def fake_factory(cluster: FakeCluster, seen: dict[str, Any]) -> _status.PoolFactory:
    """A get_pool stand-in: records what status asked for, returns a pool over fake replicas."""

    def factory(hosts: Any, *, dsn: str | None = None, **options: Any) -> ReplicaPool:
        seen.update(hosts=hosts, dsn=dsn, **options)
        assert options.pop("connect_on_create") is False  # status reports every replica itself
        return make_pool(cluster, **options)

    return factory


@pytest.fixture
def abc() -> FakeCluster:
    return FakeCluster("a", "b", "c")


# -- the parser ----------------------------------------------------------------------------------


def test_demo_defaults() -> None:
    args = build_parser().parse_args(["demo"])
    assert (args.replicas, args.strategy, args.duration, args.threads, args.verbose) == (3, None, 40.0, 3, 0)


@pytest.mark.parametrize(
    "argv",
    [["demo", "--replicas", "1"], ["demo", "--duration", "0"], ["demo", "--duration", "x"],
     ["status"], ["status", "a:1", "--timeout", "-1"], ["status", "a:1", "--min-healthy", "x"], []],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_misspelt_strategy_gets_a_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--strategy", "round_robbin"]) == 2
    err = capsys.readouterr().err
    assert "Unknown load_balancing 'round_robbin' (did you mean 'round_robin'?); valid choices: random" in err


def test_unknown_strategy_exits_2_listing_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--strategy", "fastest"]) == 2
    err = capsys.readouterr().err
    assert "round_robin" in err
    assert "Traceback" not in err


def test_module_entry_point_and_version() -> None:
    done = subprocess.run([sys.executable, "-m", "clickhouse_lb", "--version"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0
    assert done.stdout.startswith("clickhouse-lb ")


# -- status over fake replicas -------------------------------------------------------------------


def test_status_all_up(abc: FakeCluster) -> None:
    out = io.StringIO()
    seen: dict[str, Any] = {}
    assert run_status(status_args("a:8123,b:8123", "c:8123"), out, fake_factory(abc, seen)) == 0
    assert seen["hosts"] == ["a:8123,b:8123", "c:8123"]
    assert seen["dsn"] is None
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["address", "up", "latency", "version", "probe", "last_probe", "delay",
                                "errors_count", "estimated_recovery_time", "in_flight", "latency_ewma", "error"]
    assert [line.split()[:2] for line in lines[1:4]] == [["a:8123", "yes"], ["b:8123", "yes"], ["c:8123", "yes"]]
    assert "command@a" in lines[1]  # the answer to SELECT version()
    assert lines[-1] == "3/3 replicas answered (min 1): OK"
    assert [c[0] for c in abc["a"].calls] == ["ping", "command"]


def test_status_one_down_json_and_min_healthy(abc: FakeCluster) -> None:
    abc["b"].fail_creation = refused
    out = io.StringIO()
    assert run_status(status_args("a,b,c", "--json", "--min-healthy", "3"), out, fake_factory(abc, {})) == 1
    report = json.loads(out.getvalue())
    assert (report["healthy"], report["total"], report["min_healthy"], report["ok"]) == (2, 3, 3, False)
    down = report["replicas"][1]
    assert down["address"] == "b:8123"
    assert down["up"] is False
    assert down["latency_ms"] is None
    assert down["errors_count"] == 1
    assert down["estimated_recovery_time"] > 0
    assert "Connection refused" in down["error"]
    assert down["latency_ewma"] is None  # never answered: no latency average
    up = report["replicas"][0]
    assert up["up"] is True
    assert up["latency_ms"] >= 0
    assert up["errors_count"] == 0
    # The ping fed the pool's load view (least_loaded): it ended, and its latency was averaged.
    assert up["in_flight"] == 0
    assert up["latency_ewma"] is not None
    assert up["latency_ewma"] >= 0
    again = fake_factory(FakeCluster("a", "b", "c"), {})
    assert run_status(status_args("a,b,c", "--min-healthy", "2"), io.StringIO(), again) == 0


def test_status_ping_answering_false_counts_as_down(abc: FakeCluster) -> None:
    class NoPong(FakeCluster):
        def factory(self, **options: Any) -> Any:
            client = super().factory(**options)
            if options["host"] == "c":
                client.ping = lambda timeout=None: False  # type: ignore[method-assign]
            return client

    cluster = NoPong("a", "b", "c")
    out = io.StringIO()
    assert run_status(status_args("a,b,c", "--json"), out, fake_factory(cluster, {})) == 0
    report = json.loads(out.getvalue())
    assert [r["up"] for r in report["replicas"]] == [True, True, False]
    assert report["replicas"][2]["error"] == "ping failed"


def test_status_does_not_count_a_query_failure_against_a_replica(abc: FakeCluster) -> None:
    abc["b"].outcomes = ["ok", lambda: server_error(516, "AUTHENTICATION_FAILED")]  # ping ok, then the query
    out = io.StringIO()
    assert run_status(status_args("a,b,c", "--json"), out, fake_factory(abc, {})) == 0
    report = json.loads(out.getvalue())
    b = report["replicas"][1]
    assert b["up"] is False
    assert "AUTHENTICATION_FAILED" in b["error"]
    assert b["errors_count"] == 0  # wrong credentials say nothing about the replica's health


def test_status_passes_credentials_and_timeouts(abc: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli.PASSWORD_ENV, "from-env")
    seen: dict[str, Any] = {}
    args = status_args("a,b,c", "--user", "bob", "--database", "db", "--timeout", "1.5", "--secure")
    run_status(args, io.StringIO(), fake_factory(abc, seen))
    assert seen["username"] == "bob"
    assert seen["password"] == "from-env"
    assert seen["database"] == "db"
    assert seen["secure"] is True
    assert seen["connect_timeout_with_failover_ms"] == 1500
    assert (seen["connect_timeout"], seen["send_receive_timeout"]) == (2, 2)
    seen.clear()
    run_status(status_args("a,b,c", "--password", "explicit"), io.StringIO(), fake_factory(abc, seen))
    assert seen["password"] == "explicit"
    assert "secure" not in seen  # a DSN's own scheme decides unless --secure is given


def test_status_takes_a_dsn(abc: FakeCluster) -> None:
    seen: dict[str, Any] = {}
    dsn = "clickhouse://u:pw@a:8123,b:8123,c:8123/db"
    assert run_status(status_args(dsn), io.StringIO(), fake_factory(abc, seen)) == 0
    assert (seen["dsn"], seen["hosts"]) == (dsn, None)
    assert "password" not in seen  # the DSN's own
    assert "username" not in seen


# -- status from the command line, nothing listening --------------------------------------------


def test_status_with_nothing_listening(capsys: pytest.CaptureFixture[str]) -> None:
    hosts = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    assert main(["status", hosts, "--timeout", "1", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["healthy"] == 0
    # The check and the pool's probes both count refused connections.
    assert all(not r["up"] and r["errors_count"] >= 1 for r in report["replicas"])
    assert [r["probe_state"] for r in report["replicas"]] == ["down", "down"]
    assert main(["status", hosts, "--timeout", "1", "--min-healthy", "0"]) == 0
    table = capsys.readouterr().out
    assert "connection refused" in table
    assert "0/2 replicas answered (min 0): OK" in table


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["a:1", "--min-healthy", "2"], "--min-healthy 2 but only 1 replicas given"),
        (["a:1", "--min-healthy", "-1"], "Bad --min-healthy"),
        (["a:notaport"], "Bad port"),
        (["a:1", "a:1"], "Duplicate replica"),
        (["clickhouse://a:1/db", "b:1"], "either one DSN or host names"),
        (["clickhouse://u:pw@/db"], "No hosts in DSN"),
        (["h1:8123,,h2"], "Empty host name in 'h1:8123,,h2'"),  # as the dialect refuses ch-1,,ch-2
        (["a:1", "b:1,"], "Empty host name in 'b:1,'"),
        (["a:1", "--user", "u", "--secure", "--timeout", "1"], None),
    ],
)
def test_status_configuration_errors_exit_2_without_traceback(
    argv: list[str], message: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["status", *argv])
    err = capsys.readouterr().err
    if message is None:  # valid arguments: only the (unreachable) replica makes it fail
        assert code == 1
        return
    assert code == 2
    assert message in err
    assert err.startswith("clickhouse-lb status: ")
    assert "Traceback" not in err


# -- output helpers ------------------------------------------------------------------------------


def test_format_table_aligns_columns_ignoring_colour_codes() -> None:
    lines = format_table(("a", "bb"), [("\x1b[32mup\x1b[0m", "1"), ("DOWN", "22")], indent="  ")
    plain = [_console._ANSI_STYLE.sub("", line) for line in lines]
    assert plain == ["  a     bb", "  up    1", "  DOWN  22"]


def test_short_error() -> None:
    assert short_error("OperationalError: ... [Errno 111] Connection refused)") == "connection refused"
    assert short_error("ReadTimeoutError: Read timed out. (read timeout=1)") == "timed out"
    assert short_error(None) == ""
    assert short_error("x" * 100, width=20) == "x" * 17 + "..."
    assert short_error("weird http://u:pw@h/ thing") == "weird http://u:***@h/ thing"


def test_library_logging_routes_and_restores() -> None:
    lb = logging.getLogger("clickhouse_lb")
    before = (lb.level, list(lb.handlers), lb.propagate)
    stream = io.StringIO()
    with library_logging(1, stream):
        lb.info("shown at -v")
        lb.debug("hidden at -v")
        logging.getLogger("clickhouse_connect").error("hidden below -vv")
    with library_logging(0, stream):
        lb.warning("silent by default")
    assert "shown at -v" in stream.getvalue()
    assert "hidden" not in stream.getvalue()
    assert "silent" not in stream.getvalue()
    assert (lb.level, lb.handlers, lb.propagate) == before


# -- demo building blocks ------------------------------------------------------------------------


def test_demo_without_chdb_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(_demo, "chdb_available", lambda: False)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "pip install '.[local]'" in err
    assert "pip install 'clickhouse-lb[local] @ git+https://github.com/clickhouse-lb/clickhouse-lb'" in err


def test_timing_scales_with_duration() -> None:
    default = _demo.Timing.scaled(40.0, len(_demo.TOUR))
    phases = (default.per_strategy * len(_demo.TOUR) + default.before_kill + default.after_kill
              + default.after_restart)
    assert 38 <= phases <= 42
    assert 2 <= default.half_life <= 4  # decay visible within the minute
    short = _demo.Timing.scaled(6.0, len(_demo.TOUR))
    assert short.half_life == 0.5
    assert short.per_strategy < default.per_strategy
    assert short.recovery_grace >= 6 * short.half_life
    single = _demo.Timing.scaled(40.0, 1)
    assert single.per_strategy <= 6.0


def test_demo_options_tour() -> None:
    assert _demo.DemoOptions().tour == _demo.TOUR
    assert _demo.DemoOptions().fault_strategy is LoadBalancing.ROUND_ROBIN
    only = _demo.DemoOptions(strategy=LoadBalancing.IN_ORDER)
    assert (only.tour, only.fault_strategy) == ((LoadBalancing.IN_ORDER,), LoadBalancing.IN_ORDER)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "environ", "force_plain", "live"),
    [
        (io.StringIO(), {}, False, False),
        (Tty(), {}, False, True),
        (Tty(), {"NO_COLOR": "1"}, False, False),
        (Tty(), {"TERM": "dumb"}, False, False),
        (Tty(), {}, True, False),
    ],
)
def test_screen_is_live_only_on_a_colour_terminal(
    stream: io.StringIO, environ: dict[str, str], force_plain: bool, live: bool
) -> None:
    assert _demo.Screen.for_stream(stream, force_plain=force_plain, environ=environ).live is live


def test_plain_screen_writes_lines_only() -> None:
    out = io.StringIO()
    screen = _demo.Screen(out, live=False)
    screen.show(["table"])
    screen.line("event")
    assert screen.paint("up", "good") == "up"
    screen.clear()
    assert out.getvalue() == "event\n"


def test_live_screen_redraws_in_place_below_permanent_lines() -> None:
    out = Tty()
    screen = _demo.Screen(out, live=True)
    screen.show(["t1", "t2"])
    screen.show(["t3", "t4"])
    screen.line("event")
    screen.clear()
    assert out.getvalue() == (
        "t1\nt2\n" "\x1b[2F\x1b[J" "t3\nt4\n" "\x1b[2F\x1b[J" "event\n" "t3\nt4\n" "\x1b[2F\x1b[J"
    )
    assert screen.paint("up", "good") == "\x1b[32mup\x1b[0m"


def test_recent_share_is_over_the_window() -> None:
    recent = _demo.RecentShare(window=2.0)
    from collections import Counter

    assert recent.add(0.0, Counter(r1=0, r2=0)) == {"r1": 0.0, "r2": 0.0}
    recent.add(1.0, Counter(r1=10, r2=10))
    recent.add(3.0, Counter(r1=10, r2=30))
    assert recent.add(4.0, Counter(r1=10, r2=40)) == {"r1": 0.0, "r2": 1.0}


def test_tally_and_claims() -> None:
    tally = _demo.Tally(["r1", "r2"])
    tally.served_by("r1")
    tally.failure(RuntimeError("boom http://u:pw@h/\nsecond line"))
    assert tally.statements == 2
    assert tally.last_failure == "RuntimeError: boom http://u:***@h/"
    claims = _demo.Claims(failed=0, victim="r1", victim_errors=3, victim_served_while_down=0,
                          others_served_while_down=10, returned_after=1.5)
    assert claims.met
    for change in ({"failed": 1}, {"victim_errors": 0}, {"victim_served_while_down": 2},
                   {"others_served_while_down": 0}, {"returned_after": None}):
        broken = _demo.Claims(**{**claims.__dict__, **change})
        assert not broken.met, change


def test_tally_counts_a_statement_in_the_phase_it_was_sent_in() -> None:
    tally = _demo.Tally(["r1", "r2"])
    sent_before = time.monotonic()
    tally.served_by("r1", sent_before)
    tally.next_phase()
    tally.served_by("r2", sent_before)  # answered after the mark, sent before it
    tally.served_by("r2", time.monotonic())
    first, second = tally.phases()
    assert (first["r1"], first["r2"], second["r1"], second["r2"]) == (1, 1, 0, 1)
    assert tally.snapshot() == {"r1": 1, "r2": 2}


def test_time_estimate_covers_every_phase_and_the_replica_starts() -> None:
    timing = _demo.Timing.scaled(40.0, len(_demo.TOUR))
    phases = (timing.per_strategy * len(_demo.TOUR) + timing.before_kill + timing.after_kill
              + timing.after_restart)
    assert _demo.estimated_seconds(timing, len(_demo.TOUR), 3.0) == pytest.approx(phases + 6.0)
    assert _demo.estimated_seconds(timing, 1, 3.0) < _demo.estimated_seconds(timing, len(_demo.TOUR), 3.0)


def test_summary_counts_the_failover_part_only_and_agrees_with_its_claims() -> None:
    from collections import Counter
    from types import SimpleNamespace

    out = io.StringIO()
    cluster = SimpleNamespace(names=["r1", "r2"], hosts=["127.0.0.11:1", "127.0.0.12:2"])
    demo = _demo.Demo(cluster, _demo.DemoOptions(replicas=2), _demo.Timing.scaled(10.0, 5),
                      _demo.Screen(out, live=False))
    demo.total = Counter(r1=1000, r2=900)  # the strategy tour: not in the summary
    demo.claims = _demo.Claims(
        victim="r2", victim_errors=4, victim_served_while_down=0, others_served_while_down=50, returned_after=1.0,
        phases={"before the kill": Counter(r1=10, r2=11), "while r2 was down": Counter(r1=50, r2=0),
                "from the restart on": Counter(r1=20, r2=19)},
        errors_recorded=Counter(r2=4), failovers=4,
    )
    demo.summary()
    text = out.getvalue()
    assert "the strategy tour is not counted" in text
    assert "1000" not in text
    rows = {line.split()[0]: line.split()[2:] for line in text.splitlines() if line.startswith(("  r1 ", "  r2 "))}
    assert rows == {"r1": ["10", "50", "20", "0"], "r2": ["11", "0", "19", "4"]}
    assert "statements 110, failed 0, failovers 4" in text
    assert "r2's errors rose while it was down (4 recorded)" in text


def test_status_watch_refreshes_count_times(abc: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(_status.time, "sleep", pauses.append)  # no real waiting between refreshes
    out = io.StringIO()
    assert run_status(status_args("a,b,c", "--watch", "0.5", "--count", "3"), out, fake_factory(abc, {})) == 0
    assert out.getvalue().count("3/3 replicas answered") == 3
    assert pauses == [0.5, 0.5]
    assert [c[0] for c in abc["a"].calls].count("ping") == 3


def test_status_count_needs_watch(abc: FakeCluster) -> None:
    with pytest.raises(cli.ConfigurationError, match="--count"):
        run_status(status_args("a,b,c", "--count", "2"), io.StringIO(), fake_factory(abc, {}))


def test_status_shows_what_the_probes_saw(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Ping(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"Ok.\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    live = f"127.0.0.1:{server.server_address[1]}"
    dead = f"127.0.0.1:{free_port()}"
    cluster = FakeCluster(live.partition(":")[0])

    def factory(hosts: Any, *, dsn: str | None = None, **options: Any) -> ReplicaPool:
        # Real probes (over HTTP to the two addresses), fake statement clients.
        from clickhouse_lb.config.pool_config import resolve_pool_config, sync_client_option_names

        assert options.pop("connect_on_create") is False  # status reports every replica itself
        from clickhouse_lb.config.settings import BALANCING_SETTING_NAMES

        balancing = {k: options.pop(k) for k in list(options) if k in BALANCING_SETTING_NAMES}
        config = resolve_pool_config(hosts, dsn=None, balancing=balancing, client_options=options,
                                     valid_client_options=sync_client_option_names())
        return ReplicaPool(config, client_factory=lambda **o: cluster.factory(**{**o, "host": "127.0.0.1"}))

    out = io.StringIO()
    try:
        run_status(status_args(live, dead, "--json"), out, factory)
    finally:
        server.shutdown()
        server.server_close()
    rows = json.loads(out.getvalue())["replicas"]
    assert [r["probe_state"] for r in rows] == ["up", "down"]
    assert rows[0]["probe_latency_ms"] is not None
    assert rows[1]["last_probe_age"] >= 0
    assert rows[0]["delay"] is None
