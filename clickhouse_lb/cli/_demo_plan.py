"""What ``clickhouse-lb demo`` runs: its options, the strategy tour and its phases' timing."""

from __future__ import annotations

from dataclasses import dataclass

from clickhouse_lb.config.settings import LoadBalancing

WHO = "SELECT getMacro('replica')"
TOUR = (
    LoadBalancing.ROUND_ROBIN,
    LoadBalancing.IN_ORDER,
    LoadBalancing.RANDOM,
    LoadBalancing.NEAREST_HOSTNAME,
    LoadBalancing.FIRST_OR_RANDOM,
)
FAULT_STRATEGY = LoadBalancing.ROUND_ROBIN
STATEMENT_TIMEOUT = 5  # seconds: send_receive_timeout of every replica client
PACE = 0.002  # seconds each client thread pauses between statements, to leave the replicas some CPU
LIVE_REFRESH = 0.2  # seconds between two redraws of the live table
REPLICA_START_GUESS = 3.0  # seconds to start one replica (2 cores, loaded) before one was timed


@dataclass(frozen=True)
class DemoOptions:
    """What ``clickhouse-lb demo`` was asked for."""

    replicas: int = 3
    strategy: LoadBalancing | None = None
    duration: float = 40.0
    threads: int = 3
    verbose: int = 0

    @property
    def tour(self) -> tuple[LoadBalancing, ...]:
        return (self.strategy,) if self.strategy else TOUR

    @property
    def fault_strategy(self) -> LoadBalancing:
        return self.strategy or FAULT_STRATEGY


@dataclass(frozen=True)
class Timing:
    """How long each part runs; everything scales with ``--duration``."""

    half_life: float
    per_strategy: float
    before_kill: float
    after_kill: float
    after_restart: float
    recovery_grace: float
    progress: float
    window: float

    @classmethod
    def scaled(cls, duration: float, strategies: int) -> Timing:
        """Split ``duration`` seconds: ~45% tour, 10% before the kill, 20% after it, 25% after the
        restart. The half-life is short enough for the decay to show: duration/15, in 0.5..4 s."""
        half_life = min(4.0, max(0.5, duration / 15.0))
        return cls(
            half_life=round(half_life, 2),
            per_strategy=min(6.0, max(0.5, duration * 0.45 / strategies)),
            before_kill=max(0.5, duration * 0.10),
            after_kill=max(1.0, duration * 0.20),
            after_restart=max(1.0, duration * 0.25),
            # A returning replica needs bits(errors) half-lives; allow that much more if needed.
            recovery_grace=max(5.0, 6 * half_life),
            progress=max(1.0, duration / 20.0),
            window=max(1.0, min(3.0, duration / 15.0)),
        )


ERRORS_EXPLAINED = (
    "errors_count: failed attempts the pool counted against a replica; it prefers replicas with fewer, and "
    "halves the counts every distributed_replica_error_half_life (as ClickHouse does), so a replica that "
    "failed gets traffic again once its count decays to 0"
)


def estimated_seconds(timing: Timing, strategies: int, replica_start: float) -> float:
    """The run's length: every phase, plus the cluster start and the replica restart
    (``replica_start`` seconds each: a guess before the cluster is up, then as measured). A
    restarted replica usually returns within ``after_restart``; only a slow decay adds time."""
    phases = timing.per_strategy * strategies + timing.before_kill + timing.after_kill + timing.after_restart
    return phases + 2 * replica_start
