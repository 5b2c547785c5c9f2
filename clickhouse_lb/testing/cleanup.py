"""``python -m clickhouse_lb.testing.cleanup [DIR]``: after a LocalCluster's owner was killed
(SIGKILL), kill what is left of its replicas and remove its temporary directory. Clusters
whose owner is alive are never touched. Prints each directory removed."""

from __future__ import annotations

import sys

from clickhouse_lb.testing._orphans import cleanup_orphans


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    for path in cleanup_orphans(args[0] if args else None):
        print(f"removed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
