"""Static provisioning: a fixed number of replicas, never changed.

The reference point every autoscaler is measured against (what a team does
without an autoscaler: provision ``N`` replicas for the expected peak).  The
decision is ``clamp(N, min_replicas, max_replicas)`` every period; it ignores
every metric of the :class:`~sim.baselines.base.Observation`.

Examples
--------
>>> from sim.baselines.base import Observation
>>> s = StaticReplicas(StaticParams(replicas=4))
>>> obs = Observation(t_s=0.0, zone="az-a", model="m", replicas_ready=1, replicas_starting=0,
...                   desired=1, ongoing_requests=0, queue_len=0, arrival_rate_rps=0.0,
...                   gpu_util=0.0, window=None)
>>> s.decide(obs)
4
"""

from __future__ import annotations

from dataclasses import dataclass

from core.defaults import ITL_SLO_MS, MAX_REPLICAS, MIN_REPLICAS, TTFT_SLO_MS
from sim.baselines.base import BaselineBase, Observation, check

__all__ = ["StaticParams", "StaticReplicas"]


@dataclass(frozen=True)
class StaticParams:
    """``replicas``: the fixed count (default 4); ``period_s``: how often it is re-asserted."""

    replicas: int = 4
    period_s: float = 15.0

    def __post_init__(self) -> None:
        check(
            isinstance(self.replicas, int) and self.replicas >= 0, "replicas", self.replicas, "must be an integer >= 0"
        )
        check(self.period_s > 0, "period_s", self.period_s, "must be > 0")


class StaticReplicas(BaselineBase):
    """Fixed ``N`` replicas (see the module docstring)."""

    name = "static"

    def __init__(
        self,
        params: StaticParams | None = None,
        *,
        min_replicas: int = MIN_REPLICAS,
        max_replicas: int = MAX_REPLICAS,
        slo_ttft_ms: float = TTFT_SLO_MS,
        slo_itl_ms: float = ITL_SLO_MS,
        replica_capacity_rps: float | None = None,
    ) -> None:
        super().__init__(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            slo_ttft_ms=slo_ttft_ms,
            slo_itl_ms=slo_itl_ms,
            replica_capacity_rps=replica_capacity_rps,
        )
        self.params = params or StaticParams()
        self.period_s = self.params.period_s

    def decide(self, obs: Observation) -> int | None:
        """Return the fixed count (clamped) when the current desired count differs."""
        return self.changed(obs, self.params.replicas)
