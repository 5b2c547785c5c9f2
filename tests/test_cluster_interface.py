"""The replication and network fault names on both clusters (no cluster is started here)."""

from __future__ import annotations

import pytest

from clickhouse_lb.testing import DockerCluster, LocalCluster


def test_both_clusters_name_the_cluster_like_docker_compose() -> None:
    assert DockerCluster().cluster_name == "lb_cluster"
    assert LocalCluster().cluster_name == "lb_cluster"
    assert LocalCluster(cluster_name="other").cluster_name == "other"


@pytest.mark.parametrize(
    ("call", "hint"),
    [
        (lambda c: c.delay_replication(0, 1.0), "stop_replication"),
        (lambda c: c.blackhole(0), "LocalCluster"),
        (lambda c: c.unblackhole(0), "LocalCluster"),
    ],
)
def test_docker_cluster_says_what_a_real_server_cannot_do(call: object, hint: str) -> None:
    assert callable(call)
    with pytest.raises(NotImplementedError, match=hint):
        call(DockerCluster())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cluster_name": ""}, "cluster_name"),
        ({"cluster_name": "a b"}, "cluster_name"),
        ({"port": 0}, "port"),
        ({"shared_port": True, "distinct_addresses": False}, "distinct"),
    ],
)
def test_local_cluster_refuses_bad_options(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LocalCluster(replicas=2, **kwargs)  # type: ignore[arg-type]
