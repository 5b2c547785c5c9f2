"""Integration fixtures: the clickhouse_lb.testing pytest plugin (one session-scoped cluster).

``CLICKHOUSE_LB_CLUSTER=local`` (default) starts a LocalCluster; ``docker`` uses docker-compose.yml.
"""

from collections.abc import Iterator

import pytest

from clickhouse_lb import shared_state
from clickhouse_lb.testing.pytest_plugin import clickhouse_cluster, healthy_clickhouse_cluster

__all__ = ["clickhouse_cluster", "healthy_clickhouse_cluster"]


@pytest.fixture(autouse=True)
def _fresh_shared_balancing_state() -> Iterator[None]:
    """Pools and engines over the same replicas share their balancing state for the life of the
    process (clickhouse_lb.shared_state): each test starts from none, as a new process would."""
    shared_state.registry.clear()
    yield
    shared_state.registry.clear()
