"""The health probes' settings (``health_check_*``): one frozen record, parsed and bounded here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from clickhouse_lb.config._fields import InSeconds, parse_fields
from clickhouse_lb.config._values import bounded_int
from clickhouse_lb.config.settings import unknown_name_error
from clickhouse_lb.errors import ConfigurationError


@dataclass(frozen=True)
class HealthSettings:
    """How the background probes run. Milliseconds, in the style of ClickHouse's
    ``connect_timeout_with_failover_ms``; ``health_check_interval_ms=0`` turns probing off."""

    #: Every replica is probed this often (the sweep); 0: no probes at all (decay only).
    health_check_interval_ms: int = 1000
    #: Suspect replicas (errors, a failed last attempt, marked down) are probed this often.
    health_check_fast_interval_ms: int = 200
    #: A probe that has no answer after this long has failed.
    health_check_timeout_ms: int = 500
    #: Consecutive successful probes that re-admit a replica.
    health_check_rise: int = 2
    #: Consecutive failed probes that mark a replica down (each failed probe from then on counts an error).
    health_check_fall: int = 1
    #: Each replica's replication delay (``system.replicas``) is read this often; 0: never.
    health_check_delay_interval_ms: int = 5000

    @property
    def enabled(self) -> bool:
        return self.health_check_interval_ms > 0

    interval = InSeconds("health_check_interval_ms")
    fast_interval = InSeconds("health_check_fast_interval_ms")
    timeout = InSeconds("health_check_timeout_ms")

    @property
    def delay_interval(self) -> float | None:
        return self.health_check_delay_interval_ms / 1000.0 if self.health_check_delay_interval_ms else None


HEALTH_SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(HealthSettings))

#: Every probe setting is a bounded integer.
_PARSERS = dict.fromkeys(HEALTH_SETTING_NAMES, bounded_int)

DEFAULT_HEALTH = HealthSettings()

NO_PROBES = HealthSettings(health_check_interval_ms=0)


def parse_health_settings(values: Mapping[str, Any]) -> HealthSettings:
    """Validate probe settings given by name (strings allowed, as from a URL)."""
    unknown = partial(unknown_name_error, "health check setting")
    parsed = parse_fields(values, _PARSERS, unknown=unknown)
    settings = HealthSettings(**parsed)
    if settings.enabled and settings.health_check_fast_interval_ms > settings.health_check_interval_ms:
        raise ConfigurationError(
            f"Bad health_check_fast_interval_ms {settings.health_check_fast_interval_ms}: it must not exceed "
            f"health_check_interval_ms ({settings.health_check_interval_ms}); suspect replicas are probed more often"
        )
    return settings
