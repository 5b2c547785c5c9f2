"""Test clusters for clickhouse-lb: real ClickHouse replicas to balance over, with fault injection.

* :class:`LocalCluster` - n local replica processes running the real ClickHouse engine (chdb)
  behind ClickHouse's HTTP interface; needs only the ``local`` extra, no Docker.
* :class:`DockerCluster` - the repository's ``docker-compose.yml`` (official clickhouse-server
  images, ClickHouse Keeper, ReplicatedMergeTree).
* :class:`User` - a further user (password, readonly level) for ``LocalCluster(users=...)``.
* :func:`cluster_from_env` - one of them per ``CLICKHOUSE_LB_CLUSTER`` (``local``, the default,
  or ``docker``).
* ``clickhouse_lb.testing.pytest_plugin`` - opt-in pytest fixtures (``clickhouse_cluster``,
  ``healthy_clickhouse_cluster``).

Importing this package does not import chdb: only the replica processes do.
"""

from __future__ import annotations

import os
from typing import Any

from clickhouse_lb.testing._base import ClusterBase, ClusterError
from clickhouse_lb.testing._users import User
from clickhouse_lb.testing.cluster import LocalCluster
from clickhouse_lb.testing.docker import DockerCluster

__all__ = ["ClusterBase", "ClusterError", "DockerCluster", "LocalCluster", "User", "cluster_from_env"]

ENV_VAR = "CLICKHOUSE_LB_CLUSTER"


def cluster_from_env(**kwargs: Any) -> ClusterBase:
    """A (not yet started) cluster of the kind named by ``CLICKHOUSE_LB_CLUSTER``: local or docker.

    Keyword arguments go to the cluster's constructor.
    """
    kind = os.environ.get(ENV_VAR, "local").strip().lower() or "local"
    if kind == "local":
        return LocalCluster(**kwargs)
    if kind == "docker":
        return DockerCluster(**kwargs)
    raise ValueError(f"{ENV_VAR} must be 'local' or 'docker', not {kind!r}")
