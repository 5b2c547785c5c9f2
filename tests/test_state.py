"""Error accounting: decay on an injected monotonic clock, cap, recovery estimate, counters."""

from __future__ import annotations

import pytest

from clickhouse_lb.core.state import ReplicaSetState, decay_shifts, estimated_recovery_time

from .conftest import FakeClock


def _state(clock: FakeClock, half_life: float = 60, cap: int = 1000, size: int = 2) -> ReplicaSetState:
    state = ReplicaSetState(size, half_life=half_life, error_cap=cap, clock=clock)
    state.select(advance_round_robin=False)
    return state


def test_errors_halve_once_per_whole_half_life(clock: FakeClock) -> None:
    state = _state(clock)
    state.load([13, 4])
    clock.advance(150)
    assert state.select(advance_round_robin=False).errors == [3, 1]


def test_leftover_fraction_is_dropped_when_the_counts_shift(clock: FakeClock) -> None:
    state = _state(clock)
    state.load([8, 0])
    clock.advance(90)  # one shift; the clock restarts here, the 30 s left over are lost
    assert state.select(advance_round_robin=False).errors == [4, 0]
    clock.advance(59)
    assert state.select(advance_round_robin=False).errors == [4, 0]
    clock.advance(1)
    assert state.select(advance_round_robin=False).errors == [2, 0]


def test_zero_half_life_clears_at_every_selection(clock: FakeClock) -> None:
    state = _state(clock, half_life=0)
    state.record_error(0)
    assert state.select(advance_round_robin=False).errors == [0, 0]


def test_cap(clock: FakeClock) -> None:
    state = _state(clock, cap=3)
    for _ in range(10):
        state.record_error(1, "x")
    assert state.counts()[1].errors == 3


def test_counts_are_a_look_that_does_not_move_the_clock(clock: FakeClock) -> None:
    state = _state(clock)
    state.load([8, 0])
    clock.advance(90)
    assert state.counts()[0].errors == 4
    clock.advance(30)  # 120 s since the real last decrease: two shifts at the next selection
    assert state.select(advance_round_robin=False).errors == [2, 0]


def test_recovery_estimate_and_recovered_list(clock: FakeClock) -> None:
    state = _state(clock, half_life=10)
    state.load([3, 0])
    assert state.counts()[0].estimated_recovery_time == 20
    clock.advance(5)
    assert state.counts()[0].estimated_recovery_time == 15
    clock.advance(15)
    assert state.select(advance_round_robin=False).recovered == [0]


def test_a_backwards_clock_neither_wipes_nor_freezes(clock: FakeClock) -> None:
    state = _state(clock)
    state.load([5, 0])
    clock.advance(-3600)
    assert state.select(advance_round_robin=False).errors == [5, 0]


def test_round_robin_counter_advances_only_for_statements(clock: FakeClock) -> None:
    state = ReplicaSetState(2, clock=clock, round_robin_start=41)
    assert state.select(advance_round_robin=False).round_robin == 41
    assert state.select(advance_round_robin=True).round_robin == 41
    assert state.select(advance_round_robin=True).round_robin == 42


def test_selection_carries_slowdowns_and_says_when_there_are_none(clock: FakeClock) -> None:
    state = _state(clock, half_life=10)
    assert state.select(advance_round_robin=False).slowed is False
    state.record_slowdown(1)
    selection = state.select(advance_round_robin=False)
    assert (selection.slowdowns, selection.slowed) == ([0, 1], True)
    clock.advance(10)  # one half-life: 1 >> 1 == 0
    selection = state.select(advance_round_robin=False)
    assert (selection.slowdowns, selection.slowed) == ([0, 0], False)


@pytest.mark.parametrize(("elapsed", "half_life", "shifts"), [(0, 60, 0), (59.9, 60, 0), (60, 60, 1),
                                                              (3840, 60, 64), (10**9, 60, 64), (1, 0, 64)])
def test_decay_shifts(elapsed: float, half_life: float, shifts: int) -> None:
    assert decay_shifts(elapsed, half_life) == shifts


def test_estimated_recovery_time_formula() -> None:
    assert estimated_recovery_time(13, 0, 60, 30) == 210
    assert estimated_recovery_time(1000, 0, 60, 0) == 600
    assert estimated_recovery_time(1, 5, 60, 0) == 180  # the slowdowns take longer
    assert estimated_recovery_time(1, 0, 60, 100) == 0


def test_health_marks_count_errors_and_say_which_a_ping_cannot_disprove(clock: FakeClock) -> None:
    state = _state(clock)
    state.select(advance_round_robin=False)  # the decay clock starts
    state.record_error(0, "refused", sticky=False)
    assert state.health_marks() == ([1, 0], [False, False])
    state.record_error(0, "stale data")  # sticky by default: the application's own verdict
    assert state.health_marks() == ([2, 0], [True, False])
    clock.advance(120)  # 2 >> 2 == 0: decayed away, though no selection applied it yet
    state.record_error(0, "refused", sticky=False)
    assert state.health_marks() == ([3, 0], [False, False])  # the old verdict went with its count
    state.record_error(1, "stale data")
    clock.advance(60)
    state.select(advance_round_robin=False)  # 1 >> 1 == 0
    assert state.health_marks()[1] == [False, False]
    state.record_error(1, "stale data")
    assert state.clear_errors(1)
    assert state.health_marks()[1] == [False, False]


def test_an_outage_is_announced_once_until_a_success_or_a_readmission_ends_it() -> None:
    state = ReplicaSetState(2)
    assert state.announce_outage(0) is True  # the first report: WARNING
    assert state.announce_outage(0) is False  # the same outage again (probes, other threads): INFO
    assert state.announce_outage(1) is True  # another replica's outage is its own
    state.record_error(0, "refused")
    state.record_success(0)  # the outage is over
    assert state.announce_outage(0) is True
    state.clear_errors(0)  # re-admitted by the probes
    assert state.announce_outage(0) is True
