"""Integration fixtures: the clickhouse_lb.testing pytest plugin (one session-scoped cluster).

``CLICKHOUSE_LB_CLUSTER=local`` (default) starts a LocalCluster; ``docker`` uses docker-compose.yml.
"""

from clickhouse_lb.testing.pytest_plugin import clickhouse_cluster, healthy_clickhouse_cluster

__all__ = ["clickhouse_cluster", "healthy_clickhouse_cluster"]
