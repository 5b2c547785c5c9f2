"""Opt-in pytest fixtures for a ClickHouse test cluster.

Enable with ``pytest_plugins = ["clickhouse_lb.testing.pytest_plugin"]`` in a conftest.py or
``pytest -p clickhouse_lb.testing.pytest_plugin``.

* ``clickhouse_cluster`` (session scope): one started cluster for the whole run, local by
  default, Docker with ``CLICKHOUSE_LB_CLUSTER=docker`` (the tests are skipped, with the reason,
  when no Docker engine answers).
* ``healthy_clickhouse_cluster`` (function scope): the same cluster, healed (killed replicas
  restarted, paused ones resumed, delays and injected failures cleared) before and after the test;
  the process's shared balancing state (:mod:`clickhouse_lb.core.shared_state`) is forgotten with it,
  so that pools made in the test do not inherit error counts from faults a previous test injected.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from clickhouse_lb.testing import ENV_VAR, ClusterBase, DockerCluster, cluster_from_env


@pytest.fixture(scope="session")
def clickhouse_cluster() -> Iterator[ClusterBase]:
    """A started cluster shared by the whole test session."""
    if os.environ.get(ENV_VAR, "local").strip().lower() == "docker":
        reason = DockerCluster.unavailable_reason()
        if reason:
            pytest.skip(f"{ENV_VAR}=docker but {reason}")
    cluster = cluster_from_env()
    with cluster:
        yield cluster


@pytest.fixture
def healthy_clickhouse_cluster(clickhouse_cluster: ClusterBase) -> Iterator[ClusterBase]:
    """The session cluster, healed before and after the test (and the shared balancing state
    forgotten: it describes faults that heal() has just undone)."""
    clickhouse_cluster.heal()
    _forget_shared_balancing_state()
    yield clickhouse_cluster
    clickhouse_cluster.heal()
    _forget_shared_balancing_state()


def _forget_shared_balancing_state() -> None:
    # The test cluster is a layer below the pool and imports nothing from it; a pool that was
    # used in this process has loaded its shared-state module, and only then is there anything
    # to forget.
    shared_state = sys.modules.get("clickhouse_lb.core.shared_state")
    if shared_state is not None:
        shared_state.registry.clear()
