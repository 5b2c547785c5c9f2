"""Health probes without I/O: the schedule, rise/fall, and which errors a ping may clear.

A real Balancer with an injected clock; probe outcomes are handed in by the test.
"""

from __future__ import annotations

from typing import Any

import pytest

from clickhouse_lb.config.health import HealthSettings, parse_health_settings
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import BalancingSettings, LoadBalancing
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.events import ProbeEvent, ReplicaDownEvent, ReplicaRecoveredEvent
from clickhouse_lb.core.health import HealthMonitor, ProbeOutcome, ProbeState, Verdict
from clickhouse_lb.errors import ConfigurationError

from .conftest import FakeClock
from .fakes import read_timeout, refused, reset_after_send, server_error

OK = ProbeOutcome(True, 0.001)
FAIL = ProbeOutcome(False, 0.5, "timed out")
A, B, C = 0, 1, 2


class Recorder:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_replica_recovered(self, event: ReplicaRecoveredEvent) -> None:
        self.events.append(event)

    def on_replica_down(self, event: ReplicaDownEvent) -> None:
        self.events.append(event)

    def on_probe(self, event: ProbeEvent) -> None:
        self.events.append(event)


def make(clock: FakeClock, **health: Any) -> tuple[Balancer, HealthMonitor, Recorder]:
    recorder = Recorder()
    balancer = Balancer(
        [Replica("a"), Replica("b"), Replica("c")],
        BalancingSettings(load_balancing=LoadBalancing.IN_ORDER),
        clock=clock,
        listeners=[recorder],
    )
    monitor = HealthMonitor(balancer, parse_health_settings(health), clock=clock)
    return balancer, monitor, recorder


def errors(balancer: Balancer) -> list[int]:
    return [s.errors_count for s in balancer.statuses()]


def probe(monitor: HealthMonitor, index: int, outcome: ProbeOutcome) -> Verdict:
    assert index in monitor.due() or monitor.schedule._replicas[index].in_flight
    return monitor.finish(index, outcome)


# -- settings --------------------------------------------------------------------------------


def test_defaults_probe_every_second_and_suspects_five_times_a_second() -> None:
    settings = HealthSettings()
    assert settings.enabled
    assert (settings.interval, settings.fast_interval, settings.timeout) == (1.0, 0.2, 0.5)
    assert (settings.health_check_rise, settings.health_check_fall) == (2, 1)


def test_settings_come_as_strings_from_urls_and_zero_turns_probing_off() -> None:
    settings = parse_health_settings({"health_check_interval_ms": "0", "health_check_rise": "3"})
    assert not settings.enabled
    assert settings.health_check_rise == 3


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"health_check_intervall_ms": 5}, "Did you mean health_check_interval_ms"),
        ({"health_check_rise": 0}, "Bad health_check_rise 0: expected 1..1000 consecutive probes"),
        ({"health_check_timeout_ms": "soon"}, "Bad health_check_timeout_ms 'soon': expected an integer"),
        ({"health_check_interval_ms": -1}, "Bad health_check_interval_ms -1: expected 0..3600000 ms (0: probes off)"),
        ({"health_check_fast_interval_ms": 2000}, "must not exceed health_check_interval_ms (1000)"),
    ],
)
def test_bad_settings_name_the_value_and_the_rule(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_health_settings(values)
    assert message in str(info.value)


# -- schedule --------------------------------------------------------------------------------


def test_first_look_probes_every_replica_once(clock: FakeClock) -> None:
    _balancer, monitor, _ = make(clock)
    assert monitor.next_wakeup() == 0.0
    assert monitor.due() == [A, B, C]
    assert monitor.due() == []  # one probe in flight per replica


def test_healthy_replicas_are_swept_every_interval(clock: FakeClock) -> None:
    _balancer, monitor, _ = make(clock)
    for i in monitor.due():
        monitor.finish(i, OK)
    clock.advance(0.999)
    assert monitor.due() == []
    assert monitor.next_wakeup() == pytest.approx(0.001)
    clock.advance(0.001)
    assert monitor.due() == [A, B, C]


def test_a_replica_with_errors_is_probed_at_the_fast_interval(clock: FakeClock) -> None:
    balancer, monitor, _ = make(clock)
    for i in monitor.due():
        monitor.finish(i, OK)
    balancer.count_failure(B, refused())
    clock.advance(0.2)
    assert monitor.due() == [B]


def test_the_worker_never_sleeps_longer_than_the_fast_interval(clock: FakeClock) -> None:
    # A replica can become suspect at any moment; it must be probed soon after.
    _balancer, monitor, _ = make(clock, health_check_interval_ms=60_000)
    for i in monitor.due():
        monitor.finish(i, OK)
    assert monitor.next_wakeup() == pytest.approx(0.2)


def test_a_probe_in_flight_is_not_doubled(clock: FakeClock) -> None:
    _balancer, monitor, _ = make(clock)
    assert monitor.due() == [A, B, C]
    for i in (B, C):
        monitor.finish(i, OK)
    clock.advance(5)
    assert monitor.due() == [B, C]  # A's probe (hung?) still runs


# -- down ------------------------------------------------------------------------------------


def test_a_failed_probe_counts_an_error_so_statements_route_away(clock: FakeClock) -> None:
    balancer, monitor, recorder = make(clock)
    monitor.due()
    assert monitor.finish(A, FAIL) is Verdict.COUNT_ERROR
    assert errors(balancer) == [1, 0, 0]
    assert balancer.plan() == ["b:8123", "c:8123", "a:8123"]
    assert monitor.statuses()[A].probe_state == ProbeState.DOWN
    assert [e for e in recorder.events if isinstance(e, ReplicaDownEvent)] == [
        ReplicaDownEvent("a:8123", "probe failed: timed out")
    ]


def test_every_failed_probe_of_a_down_replica_counts_so_ignored_errors_are_soon_exceeded(clock: FakeClock) -> None:
    balancer, monitor, recorder = make(clock)
    for _ in range(3):
        probe(monitor, A, FAIL)
        clock.advance(0.2)
    assert errors(balancer)[A] == 3
    assert sum(isinstance(e, ReplicaDownEvent) for e in recorder.events) == 1  # one transition


def test_fall_is_the_number_of_consecutive_failures_before_counting(clock: FakeClock) -> None:
    balancer, monitor, _ = make(clock, health_check_fall=3)
    verdicts = []
    for outcome in (FAIL, FAIL, OK, FAIL, FAIL, FAIL, FAIL):
        verdicts.append(probe(monitor, A, outcome))
        clock.advance(1)
    assert verdicts[:6] == [Verdict.NOTHING] * 5 + [Verdict.COUNT_ERROR]
    assert verdicts[6] is Verdict.COUNT_ERROR
    assert errors(balancer)[A] == 2


# -- re-admission ----------------------------------------------------------------------------


def test_rise_consecutive_successes_readmit_after_an_outage(clock: FakeClock) -> None:
    balancer, monitor, recorder = make(clock)
    probe(monitor, A, FAIL)
    balancer.count_failure(A, refused())  # statements failed too
    clock.advance(0.2)
    assert probe(monitor, A, OK) is Verdict.NOTHING  # rise=2: one is not enough
    assert errors(balancer)[A] == 2
    clock.advance(0.2)
    assert probe(monitor, A, OK) is Verdict.READMIT
    assert errors(balancer)[A] == 0
    assert balancer.statuses()[A].is_up
    assert balancer.plan()[0] == "a:8123"
    assert ReplicaRecoveredEvent("a:8123", "probe") in recorder.events
    assert monitor.statuses()[A].probe_state == ProbeState.UP


def test_a_failure_in_between_restarts_the_rise_count(clock: FakeClock) -> None:
    balancer, monitor, _ = make(clock, health_check_rise=3)
    for outcome in (FAIL, OK, OK, FAIL, OK, OK):
        probe(monitor, A, outcome)
        clock.advance(0.2)
    assert errors(balancer)[A] == 2
    assert probe(monitor, A, OK) is Verdict.READMIT


def test_an_outage_the_probes_saw_clears_every_error_counted_around_it(clock: FakeClock) -> None:
    balancer, monitor, _ = make(clock)
    balancer.count_failure(A, read_timeout())  # a statement hung on it
    probe(monitor, A, FAIL)  # and the probes saw it down
    clock.advance(0.2)
    probe(monitor, A, OK)
    clock.advance(0.2)
    assert probe(monitor, A, OK) is Verdict.READMIT
    assert errors(balancer)[A] == 0


def test_refused_connections_are_healed_by_probes_that_started_after_them(clock: FakeClock) -> None:
    balancer, monitor, _ = make(clock)
    for i in monitor.due():
        monitor.finish(i, OK)
    clock.advance(1)
    assert monitor.due() == [A, B, C]
    # Killed and restarted between two probes: the statements saw refused connections and
    # cut-off responses, the probes never saw it down.
    balancer.count_failure(A, refused())
    balancer.count_failure(A, reset_after_send())
    assert monitor.finish(A, OK) is Verdict.NOTHING  # started before the errors: proves nothing
    clock.advance(0.2)
    assert probe(monitor, A, OK) is Verdict.NOTHING
    clock.advance(0.2)
    assert probe(monitor, A, OK) is Verdict.READMIT
    assert errors(balancer)[A] == 0


@pytest.mark.parametrize(
    "count_error",
    [
        pytest.param(lambda b: b.record_error(A, "stale data"), id="recorded by the application"),
        pytest.param(lambda b: b.count_failure(A, read_timeout()), id="statement timed out"),
        pytest.param(lambda b: b.count_failure(A, server_error(242, "TABLE_IS_READ_ONLY")),
                     id="server answered a replica error"),
    ],
)
def test_errors_a_ping_cannot_disprove_are_not_healed_by_one(clock: FakeClock, count_error: Any) -> None:
    balancer, monitor, recorder = make(clock)
    count_error(balancer)
    balancer.count_failure(A, refused())  # even mixed with a healable one
    for _ in range(5):
        clock.advance(0.2)
        assert probe(monitor, A, OK) is Verdict.NOTHING
    assert errors(balancer)[A] == 2
    assert not [e for e in recorder.events if isinstance(e, ReplicaRecoveredEvent)]


def test_once_such_errors_decayed_away_a_new_reachability_error_is_healable(clock: FakeClock) -> None:
    balancer, monitor, _ = make(clock)
    balancer.plan_indices()  # the decay clock starts with the first selection
    balancer.record_error(A, "stale data")
    clock.advance(60)  # one half-life: 1 >> 1 == 0
    balancer.plan_indices()  # a statement's selection applies the decay
    assert errors(balancer)[A] == 0
    balancer.count_failure(A, refused())
    probe(monitor, A, OK)
    clock.advance(0.2)
    assert probe(monitor, A, OK) is Verdict.READMIT


def test_slowdowns_survive_a_readmission(clock: FakeClock) -> None:
    balancer, monitor, _ = make(clock)
    balancer.record_slowdown(A)
    probe(monitor, A, FAIL)
    for _ in range(2):
        clock.advance(0.2)
        probe(monitor, A, OK)
    assert (balancer.statuses()[A].errors_count, balancer.statuses()[A].slowdowns_count) == (0, 1)


def test_every_probe_is_an_event_and_the_status_keeps_the_last_one(clock: FakeClock) -> None:
    _, monitor, recorder = make(clock)
    monitor.due()
    monitor.finish(A, ProbeOutcome(True, 0.004))
    monitor.finish(B, ProbeOutcome(False, 0.5, "refused"))
    assert recorder.events[0] == ProbeEvent("a:8123", True, 0.004, None)
    assert ProbeEvent("b:8123", False, 0.5, "refused") in recorder.events
    a, b, c = monitor.statuses()
    assert (a.probe_state, a.probe_latency, a.last_probe_error) == ("up", 0.004, None)
    assert a.last_probe_time is not None
    assert (b.probe_state, b.last_probe_error) == ("down", "refused")
    assert (c.probe_state, c.last_probe_time) == ("unknown", None)


# -- where the settings come from ------------------------------------------------------------


def test_probe_settings_per_pool_in_a_dsn_and_in_a_sqlalchemy_url() -> None:
    import clickhouse_lb
    from clickhouse_lb.sqlalchemy.url import engine_args_from_url

    sa = pytest.importorskip("sqlalchemy")
    with clickhouse_lb.get_pool(["a:8123", "b:8123"], health_check_interval_ms=0, connect_on_create=False) as pool:
        assert not pool.config.health.enabled
    dsn = "clickhouse://a:8123,b:8123/db?health_check_rise=3&health_check_fast_interval_ms=100"
    # keywords win over the DSN
    with clickhouse_lb.get_pool(dsn=dsn, health_check_rise=4, connect_on_create=False) as pool:
        assert (pool.config.health.health_check_rise, pool.config.health.health_check_fast_interval_ms) == (4, 100)
        assert "health_check_rise" not in (pool.config.client_options.get("settings") or {})
    url = sa.engine.make_url("clickhousedb+lb://u:p@a,b:8123/db?health_check_timeout_ms=250")
    assert engine_args_from_url(url).config.health.health_check_timeout_ms == 250
    with pytest.raises(ConfigurationError, match="Did you mean health_check_rise"):
        engine_args_from_url(sa.engine.make_url("clickhousedb+lb://u:p@a,b:8123/db?health_check_rize=2"))
    with pytest.raises(ConfigurationError, match="Bad health_check_fall 'x'"):
        clickhouse_lb.get_pool(["a:8123"], health_check_fall="x")


# -- replication delay -----------------------------------------------------------------------


def test_delays_are_read_at_their_own_slower_interval_and_only_from_replicas_seen_up(clock: FakeClock) -> None:
    _balancer, monitor, _ = make(clock, health_check_delay_interval_ms=5000)
    assert monitor.delay_due() == []  # nothing seen up yet
    monitor.due()
    monitor.finish(A, OK)
    monitor.finish(B, OK)
    monitor.finish(C, FAIL)
    assert monitor.delay_due() == [A, B]  # not C: down
    assert monitor.delay_due() == []  # in flight
    monitor.finish_delay(A, 12.0)
    monitor.finish_delay(B, None, "Code: 497. ACCESS_DENIED")  # a failed read keeps the last known value
    clock.advance(4.9)
    assert monitor.delay_due() == []
    clock.advance(0.1)
    assert monitor.delay_due() == [A, B]
    monitor.finish_delay(B, 400.0)
    assert [s.delay for s in monitor.statuses()] == [12.0, 400.0, None]
    assert monitor.schedule.worst_delay() == 400.0
    monitor.finish_delay(A, None)
    assert monitor.statuses()[A].delay == 12.0


def test_delay_interval_zero_never_reads_delays(clock: FakeClock) -> None:
    _balancer, monitor, _ = make(clock, health_check_delay_interval_ms=0)
    monitor.due()
    monitor.finish(A, OK)
    assert monitor.delay_due() == []


# -- pools sharing one balancing state (share_state) -----------------------------------------


def test_what_a_ping_may_clear_is_known_to_every_pool_sharing_the_state(clock: FakeClock) -> None:
    # Two pools over one state: the application flags stale data through one; the other's
    # probes, which see the replica answer, must not clear it.
    first, monitor, _ = make(clock)
    second = Balancer(first.replicas, first.settings, clock=clock, state=first.state)
    second_monitor = HealthMonitor(second, monitor.settings, clock=clock)
    first.record_error(A, "stale data")
    for _ in range(4):
        clock.advance(0.2)
        second_monitor.due()
        assert second_monitor.finish(A, OK) is Verdict.NOTHING
    assert errors(second)[A] == 1


def test_a_probe_started_before_another_pools_error_proves_nothing_about_it(clock: FakeClock) -> None:
    first, _, _ = make(clock)
    second = Balancer(first.replicas, first.settings, clock=clock, state=first.state)
    monitor = HealthMonitor(second, HealthSettings(), clock=clock)
    assert A in monitor.due()
    first.count_failure(A, refused())  # counted through the other pool, while the probe ran
    assert monitor.finish(A, OK) is Verdict.NOTHING
    clock.advance(0.2)
    monitor.due()
    assert monitor.finish(A, OK) is Verdict.NOTHING  # one success since the error: rise is 2
    clock.advance(0.2)
    monitor.due()
    assert monitor.finish(A, OK) is Verdict.READMIT
    assert errors(first)[A] == 0
