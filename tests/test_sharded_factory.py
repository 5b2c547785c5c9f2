"""The sharded pools' factories: a bad layout is refused before any shard's pool is made (so
before any connection attempt), and no pool made is left open by a failure."""

from __future__ import annotations

from typing import Any

import pytest

import clickhouse_lb
from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.pools import sharded, sharded_aio

from .test_client_members import _async_available

#: Nothing listens there: a pool made with its creation check would fail to connect, not refuse the weights.
UNREACHABLE = [["127.0.0.1:1"], ["127.0.0.1:2"]]

BAD_WEIGHTS = [
    ([0, 0], r"Bad shard weights \[0, 0\]: at least one shard needs a weight > 0"),
    ([-1, 1], r"Bad shard weight -1: expected an integer >= 0"),
    ([1.5, 1], r"Bad shard weight 1.5: expected an integer >= 0"),
]


def _made(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Any]:
    """The pools the factory makes through ``module.name`` (the real factory, recorded)."""
    made: list[Any] = []
    real = getattr(module, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(module, name, recording)
    return made


@pytest.mark.parametrize(("weights", "message"), BAD_WEIGHTS)
@pytest.mark.parametrize("connect_on_create", [True, False])
def test_bad_weights_are_refused_before_any_shard_pool_is_made(
    monkeypatch: pytest.MonkeyPatch, weights: list[Any], message: str, connect_on_create: bool
) -> None:
    made = _made(monkeypatch, sharded, "get_pool")
    with pytest.raises(ConfigurationError, match=message):
        clickhouse_lb.get_sharded_pool(shards=UNREACHABLE, shard_weights=weights, connect_on_create=connect_on_create)
    assert made == []


@pytest.mark.parametrize(("weights", "message"), BAD_WEIGHTS)
async def test_the_async_factory_refuses_bad_weights_before_any_shard_pool_is_made(
    monkeypatch: pytest.MonkeyPatch, weights: list[Any], message: str
) -> None:
    made = _made(monkeypatch, sharded_aio, "get_async_pool")
    with pytest.raises(ConfigurationError, match=message):
        await clickhouse_lb.get_async_sharded_pool(shards=UNREACHABLE, shard_weights=weights)
    assert made == []


def test_a_failure_after_some_shard_pools_were_made_closes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _made(monkeypatch, sharded, "get_pool")

    def refused(*args: Any, **kwargs: Any) -> None:
        raise ConfigurationError("refused on purpose, after every shard's pool was made")

    monkeypatch.setattr(sharded.ShardedPool, "_start_refresh", refused)
    with pytest.raises(ConfigurationError, match="on purpose"):
        clickhouse_lb.get_sharded_pool(shards=UNREACHABLE, connect_on_create=False)
    assert len(made) == 2
    assert all(pool._closed for pool in made)


def test_the_sharded_pool_shows_its_shards_weights_and_addresses() -> None:
    with clickhouse_lb.get_sharded_pool(shards=UNREACHABLE, shard_weights=[1, 2], connect_on_create=False) as pool:
        assert repr(pool) == "<ShardedPool 1(w1): ['127.0.0.1:1'], 2(w2): ['127.0.0.1:2']>"


@pytest.mark.skipif(not _async_available(), reason="clickhouse-connect 0.x has no native AsyncClient")
async def test_the_async_sharded_pool_shows_them_as_the_sync_one_does() -> None:
    async with await clickhouse_lb.get_async_sharded_pool(
        shards=UNREACHABLE, shard_weights=[1, 2], connect_on_create=False
    ) as aio:
        assert repr(aio) == "<AsyncShardedPool 1(w1): ['127.0.0.1:1'], 2(w2): ['127.0.0.1:2']>"
