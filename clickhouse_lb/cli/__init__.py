"""The ``clickhouse-lb`` command: ``status``, ``demo``, ``cluster`` (entry point :func:`main`)."""

from clickhouse_lb.cli._main import main

__all__ = ["main"]
