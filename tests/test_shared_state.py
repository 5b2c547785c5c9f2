"""The process-wide balancing state (clickhouse_lb.core.shared_state): key, sharing, opt-out, lifetime."""

from __future__ import annotations

import gc
import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy.engine import make_url

import clickhouse_lb
from clickhouse_lb.config._values import as_bool
from clickhouse_lb.config.pool_config import resolve_pool_config, sync_client_option_names
from clickhouse_lb.config.settings import BALANCING_SETTING_NAMES
from clickhouse_lb.core import shared_state
from clickhouse_lb.core.shared_state import StateRegistry, state_key
from clickhouse_lb.core.state import ReplicaSetState
from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.pools.pool import ReplicaPool
from clickhouse_lb.sqlalchemy.url import engine_args_from_url

from .conftest import FakeClock


def lazy_pool(*args: Any, **kwargs: Any) -> clickhouse_lb.ReplicaPool:
    """get_pool without the creation check: these pools never reach a server."""
    return clickhouse_lb.get_pool(*args, connect_on_create=False, **kwargs)

HOSTS = ["ch-1:8123", "ch-2:8123", "ch-3:8123"]


def config(hosts: Any = HOSTS, dsn: str | None = None, **options: Any) -> Any:
    balancing = {name: options.pop(name) for name in list(options) if name in BALANCING_SETTING_NAMES}
    share_state = options.pop("share_state", None)
    return resolve_pool_config(
        hosts if dsn is None else None,
        dsn=dsn,
        balancing=balancing,
        client_options=options,
        valid_client_options=sync_client_option_names(),
        share_state=share_state,
    )


def key(**options: Any) -> shared_state.StateKey:
    return state_key(config(**options))


# -- the key ---------------------------------------------------------------------------------


def test_the_same_replica_set_written_differently_has_one_key() -> None:
    base = key(username="u", database="db", load_balancing="round_robin")
    assert key(hosts="CH-1:8123,ch-2:8123,ch-3", username="u", database="db", load_balancing="ROUND_ROBIN") == base
    assert state_key(config(dsn="clickhouse://u@ch-1,ch-2,ch-3:8123/db?load_balancing=round_robin")) == base
    # No user is clickhouse-connect's default user.
    assert key() == key(username="default")


def test_options_that_do_not_shape_order_or_counts_share() -> None:
    base = key(username="u", password="one")
    assert key(username="u", password="two") == base  # secrets are not in the key
    assert key(username="u", send_receive_timeout=5, compress=False, settings={"max_threads": 2}) == base
    assert key(username="u", connections_with_failover_max_tries=9, connect_timeout_with_failover_ms=50,
               failover_timeout=3, failover_backoff_ms=10, auto_insert_deduplication_token=False) == base


@pytest.mark.parametrize(
    "change",
    [
        {"hosts": ["ch-2:8123", "ch-1:8123", "ch-3:8123"]},  # order: the state is indexed by position
        {"hosts": ["ch-1:8123", "ch-2:8123"]},
        {"hosts": ["ch-1:9000", "ch-2:8123", "ch-3:8123"]},
        {"hosts": [clickhouse_lb.Replica("ch-1", 8123, 0), "ch-2:8123", "ch-3:8123"]},  # priority
        {"secure": True, "hosts": HOSTS},
        {"username": "other"},
        {"database": "other"},
        {"load_balancing": "in_order"},
        {"load_balancing_first_offset": 1},
        {"local_hostname": "ch-2"},
        {"distributed_replica_error_half_life": 30},
        {"distributed_replica_error_cap": 10},
        {"distributed_replica_max_ignored_errors": 1},
    ],
)
def test_what_changes_who_fails_or_the_order_gets_another_key(change: dict[str, Any]) -> None:
    assert key(**change) != key()


def test_the_key_holds_no_secret() -> None:
    text = repr(key(username="u", password="s3cret-pw", access_token="tok3n"))
    assert "s3cret" not in text
    assert "tok3n" not in text


# -- sharing through get_pool ----------------------------------------------------------------


def test_pools_over_the_same_replicas_share_counts_and_round_robin() -> None:
    first = lazy_pool(HOSTS, load_balancing="round_robin")
    second = lazy_pool(",".join(HOSTS), load_balancing="round_robin")
    assert first.balancer.state is second.balancer.state
    first.record_error("ch-2:8123")
    assert [r.errors_count for r in second.replicas] == [0, 1, 0]
    # Each pool keeps its own listeners.
    assert first.balancer.listeners is not second.balancer.listeners


def test_a_pool_per_request_rotates_round_robin_evenly() -> None:
    served: Counter[int] = Counter()
    for _ in range(30):
        with lazy_pool(HOSTS, load_balancing="round_robin") as pool:
            served[pool.balancer.plan_indices()[0]] += 1
    assert served == {0: 10, 1: 10, 2: 10}


def test_a_pool_per_request_skips_a_failed_replica() -> None:
    with lazy_pool(HOSTS, load_balancing="in_order") as pool:
        pool.record_error("ch-1:8123", "connection refused")
    with lazy_pool(HOSTS, load_balancing="in_order") as pool:
        assert pool.plan() == ["ch-2:8123", "ch-3:8123", "ch-1:8123"]
        assert pool.replicas[0].last_error == "connection refused"


def test_different_users_databases_and_settings_do_not_mix() -> None:
    base = lazy_pool(HOSTS, username="etl", database="db", load_balancing="in_order")
    base.record_error("ch-1:8123")
    others = [
        lazy_pool(HOSTS, username="bi", database="db", load_balancing="in_order"),
        lazy_pool(HOSTS, username="etl", database="other", load_balancing="in_order"),
        lazy_pool(HOSTS, username="etl", database="db", load_balancing="in_order",
                               distributed_replica_error_half_life=5),
    ]
    for pool in others:
        assert pool.balancer.state is not base.balancer.state
        assert pool.plan() == HOSTS


@pytest.mark.parametrize(
    "make",
    [
        lambda: lazy_pool(HOSTS, share_state=False),
        lambda: lazy_pool(dsn="clickhouse://ch-1,ch-2,ch-3:8123/?share_state=0"),
        lambda: lazy_pool(dsn="clickhouse://ch-1,ch-2,ch-3:8123/?share_state=true", share_state="off"),
    ],
    ids=["keyword", "dsn", "keyword-over-dsn"],
)
def test_share_state_false_gives_a_pool_its_own_state(make: Any) -> None:
    shared = lazy_pool(HOSTS)
    own = make()
    assert own.config.share_state is False
    assert own.balancer.state is not shared.balancer.state
    shared.record_error("ch-1:8123")
    assert own.replicas[0].errors_count == 0
    assert len(shared_state.registry) == 1  # the opted-out pool registered nothing


def test_the_dsn_option_is_not_sent_to_the_server() -> None:
    pool = lazy_pool(dsn="clickhouse://ch-1,ch-2:8123/?share_state=1&max_threads=2")
    assert pool.config.client_options["settings"] == {"max_threads": "2"}


@pytest.mark.parametrize("value", ["maybe", 2, 1.5])
def test_a_bad_share_state_names_the_value_and_the_choices(value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"Bad share_state .*expected true or false"):
        lazy_pool(HOSTS, share_state=value)  # type: ignore[arg-type]


def test_parse_share_state() -> None:
    assert [as_bool("share_state", v) for v in (True, 1, "1", "true", "ON", "yes")] == [True] * 6
    assert [as_bool("share_state", v) for v in (False, 0, "0", "false", "Off", "no")] == [False] * 6


# -- the SQLAlchemy URL ----------------------------------------------------------------------


def test_the_url_and_connect_args_choose_sharing() -> None:
    url = make_url("clickhousedb+lb://u:p@ch-1,ch-2,ch-3:8123/db?load_balancing=round_robin")
    args = engine_args_from_url(url)
    assert args.config.share_state is True
    assert "share_state" not in (args.config.client_options.get("settings") or {})
    off = engine_args_from_url(url.update_query_dict({"share_state": "0"}))
    assert off.config.share_state is False
    assert "share_state" not in (off.config.client_options.get("settings") or {})
    assert args.with_connect_args({"share_state": False}).config.share_state is False
    assert off.with_connect_args({"send_receive_timeout": 5}).config.share_state is False
    with pytest.raises(ConfigurationError, match="Bad share_state 'sometimes'"):
        engine_args_from_url(url.update_query_dict({"share_state": "sometimes"}))


def test_engines_from_one_url_share_with_get_pool() -> None:
    url = make_url("clickhousedb+lb://u:p@ch-1,ch-2,ch-3:8123/db?load_balancing=round_robin")
    engine_pool = ReplicaPool(engine_args_from_url(url).config)
    pool = lazy_pool(HOSTS, username="u", password="p", database="db", load_balancing="round_robin")
    assert pool.balancer.state is engine_pool.balancer.state


# -- lifetime --------------------------------------------------------------------------------


def test_close_gives_the_state_back_and_an_idle_state_is_kept_for_the_next_pool() -> None:
    pool = lazy_pool(HOSTS)
    k = state_key(pool.config)
    state = pool.balancer.state
    assert shared_state.registry.users(k) == 1
    pool.close()
    pool.close()  # closing twice gives it back once
    assert shared_state.registry.users(k) == 0
    again = lazy_pool(HOSTS)
    assert again.balancer.state is state
    assert shared_state.registry.users(k) == 1


def test_a_garbage_collected_pool_gives_the_state_back() -> None:
    pool = lazy_pool(HOSTS)
    k = state_key(pool.config)
    other = lazy_pool(HOSTS)
    assert shared_state.registry.users(k) == 2
    del pool
    gc.collect()
    assert shared_state.registry.users(k) == 1
    other.close()
    assert shared_state.registry.users(k) == 0


def state_factory() -> ReplicaSetState:
    return ReplicaSetState(3)


def test_an_idle_state_goes_away_after_idle_ttl(clock: FakeClock) -> None:
    registry = StateRegistry(idle_ttl=600, clock=clock)
    lease = registry.acquire("k", state_factory)
    clock.advance(10_000)  # in use: kept however long
    assert registry.users("k") == 1
    lease.release()
    clock.advance(599)
    assert registry.users("k") == 0
    assert registry.acquire("k", state_factory).value is lease.value  # picked up again, still idle-free
    registry.acquire("k", state_factory)
    other = registry.acquire("other", state_factory)
    other.release()
    clock.advance(600)
    assert registry.users("other") is None
    assert len(registry) == 1  # "k" is still held twice


def test_idle_ttl_zero_frees_at_the_last_release(clock: FakeClock) -> None:
    registry = StateRegistry(idle_ttl=0, clock=clock)
    first = registry.acquire("k", state_factory)
    second = registry.acquire("k", state_factory)
    first.release()
    assert registry.users("k") == 1
    second.release()
    assert registry.users("k") is None
    assert registry.acquire("k", state_factory).value is not first.value


def test_at_most_max_idle_states_are_kept_the_oldest_go_first(clock: FakeClock) -> None:
    registry = StateRegistry(idle_ttl=600, max_idle=2, clock=clock)
    held = registry.acquire("held", state_factory)
    for name in ("a", "b", "c"):
        registry.acquire(name, state_factory).release()
        clock.advance(1)
    assert [registry.users(k) for k in ("a", "b", "c", "held")] == [None, 0, 0, 1]
    held.release()
    assert [registry.users(k) for k in ("b", "c", "held")] == [None, 0, 0]


def test_a_release_after_clear_does_not_touch_the_new_state(clock: FakeClock) -> None:
    registry = StateRegistry(idle_ttl=0, clock=clock)
    old = registry.acquire("k", state_factory)
    registry.clear()
    new = registry.acquire("k", state_factory)
    old.release()
    assert registry.users("k") == 1
    new.release()
    assert registry.users("k") is None


# -- threads ---------------------------------------------------------------------------------


def test_pools_made_and_closed_on_many_threads_count_every_error_and_step() -> None:
    threads, rounds = 8, 100
    start = threading.Barrier(threads)
    first_choices: Counter[int] = Counter()
    lock = threading.Lock()
    settings = {"load_balancing": "round_robin", "distributed_replica_error_cap": 10**6,
                "distributed_replica_error_half_life": 10**6}
    holder = lazy_pool(HOSTS, **settings)
    holder.record_error("ch-3:8123")  # from now on ch-1 and ch-2 take turns

    def work() -> None:
        start.wait()
        for _ in range(rounds):
            pool = lazy_pool(HOSTS, **settings)
            choice = pool.balancer.plan_indices()[0]
            pool.record_error("ch-3:8123")
            pool.close()
            with lock:
                first_choices[choice] += 1

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert holder.replicas[2].errors_count == threads * rounds + 1  # no update lost
    assert shared_state.registry.users(state_key(holder.config)) == 1  # every other pool gave it back
    # Every statement took its own round-robin step, whatever the interleaving: ch-1 and ch-2
    # alternated over 800 consecutive steps.
    assert first_choices == {0: threads * rounds // 2, 1: threads * rounds // 2}


def test_a_lease_released_twice_counts_once(clock: FakeClock) -> None:
    registry = StateRegistry(idle_ttl=600, clock=clock)
    first = registry.acquire("k", state_factory)
    registry.acquire("k", state_factory)
    first.release()
    first.release()
    assert registry.users("k") == 1


def test_a_lease_released_by_the_garbage_collector_inside_the_registry_does_not_deadlock() -> None:
    # A lease's finalizer runs wherever the collector does, e.g. during an allocation inside
    # acquire() on the same thread, while the registry's lock is held: it must not wait for it.
    import threading

    from clickhouse_lb.core.shared_state import StateRegistry

    registry = StateRegistry()

    class Owner:
        pass

    owner = Owner()
    registry.acquire("k", object).release_with(owner)
    holder = [owner]
    del owner

    def factory() -> object:
        holder.clear()  # the owner dies here, inside acquire's locked section: its lease is released
        return object()

    done = threading.Event()

    def acquire_other() -> None:
        registry.acquire("other", factory)
        done.set()

    thread = threading.Thread(target=acquire_other, daemon=True)
    thread.start()
    assert done.wait(10), "acquire() deadlocked on a release from inside its own locked section"
    assert registry.users("k") == 0  # the deferred release was applied
    assert registry.users("other") == 1
