"""Integration fixtures: the clickhouse_lb.testing pytest plugin (one session-scoped cluster).

``CLICKHOUSE_LB_CLUSTER=local`` (default) starts a LocalCluster; ``docker`` uses docker-compose.yml.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from clickhouse_lb.core import shared_state
from clickhouse_lb.testing.pytest_plugin import clickhouse_cluster, healthy_clickhouse_cluster

__all__ = ["clickhouse_cluster", "healthy_clickhouse_cluster", "pytest_terminal_summary"]


@pytest.fixture(autouse=True)
def _fresh_shared_balancing_state() -> Iterator[None]:
    """Pools and engines over the same replicas share their balancing state for the life of the
    process (clickhouse_lb.core.shared_state): each test starts from none, as a new process would."""
    shared_state.registry.clear()
    yield
    shared_state.registry.clear()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """List the documentation examples integration/test_docs.py did not run, with the reasons."""
    docs = sys.modules.get("test_docs") or sys.modules.get("integration.test_docs")
    not_run = getattr(docs, "DOCS_NOT_RUN", None)
    if not_run:
        terminalreporter.section("documentation examples not run here")
        for line in not_run:
            terminalreporter.write_line(line)
