"""``python -m clickhouse_lb``: the ``clickhouse-lb`` command (see :mod:`clickhouse_lb.cli`)."""

from __future__ import annotations

import sys

from clickhouse_lb.cli import main

if __name__ == "__main__":
    sys.exit(main())
