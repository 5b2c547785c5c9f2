"""The pools' side of the step bodies (:mod:`clickhouse_lb.core._steps`: ``Steps``, ``drive``,
``drive_async``, re-exported here for the pools): closing a replica's client quietly."""

from __future__ import annotations

from typing import Any

from clickhouse_lb.core._steps import Steps, drive, drive_async
from clickhouse_lb.core.events import logger

__all__ = ["Steps", "close_quietly", "drive", "drive_async"]


def close_quietly(client: Any) -> Steps[None]:
    """Close a replica's client; a failure is logged, never raised (closing must not fail the
    caller)."""
    try:
        yield client.close
    except Exception:
        logger.debug("closing a replica client failed", exc_info=True)
