"""Liveness-check settings of a waiting attempt (``liveness_check_*``) as one frozen policy."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LivenessPolicy:
    """When to ping a replica whose attempt is waiting for its answer. Seconds."""

    #: First check after an attempt waited this long; None: liveness checks are off.
    check_after: float | None = 0.1
    #: How long the ping may take before the replica counts as not alive.
    ping_timeout: float = 0.15
    #: Further checks while the attempt keeps waiting on a replica that answered.
    interval: float = 1.0
    #: Consecutive failed checks before a write that is not safe to repeat is abandoned.
    failed_checks_for_writes: int = 3
    #: A ping that failed while this process was itself stalled (the check woke up, or the
    #: ping's timeout fired, this much later than planned: a loaded machine, a busy event
    #: loop) proves nothing about the replica and never counts; the first ``max_inconclusive``
    #: such checks in a row are repeated at once, later ones a ping timeout later.
    stall_tolerance: float = 0.05
    max_inconclusive: int = 1

    @property
    def enabled(self) -> bool:
        return self.check_after is not None


LIVENESS_DEFAULTS = LivenessPolicy()

NO_LIVENESS = LivenessPolicy(check_after=None)
