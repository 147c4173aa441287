"""Mixed agent load on the real path: zone windows -> ``agents`` commands (no I/O).

Request telemetry may carry the signals of an agent turn (docs/model.md §15 (agents):
``agent_stability``, ``agent_rag_score``, ``agent_tool_conf``) and the path it
took (``agent_path``); a zone window reports their means over the requests
that carried them (``agent_signals_n``, ``agent_*_mean``) and the
count per path (``agent_path_counts``, :mod:`controllers.windows`).

:class:`AgentWeightsDriver` keeps, per ``(model, zone)``, an exponentially
weighted moving average of the three means over the windows that carried
signals::

    ewma <- EWMA_ALPHA * window_mean + (1 - EWMA_ALPHA) * ewma   (the first window: its mean)

``EWMA_ALPHA = 0.3``: a window's mean counts 30 %, so a step in the signals
is 90 % through after about 6.5 windows (about a minute at the default 10 s
window) and one odd window moves the weights by at most 30 % of its
deviation.  The smoothed signals give the weights of
:func:`controllers.agent_weights.weights` (the design source's coefficients
by default).  When one of the three weights differs by more than
``PUBLISH_DELTA = 0.05`` from the last *published* weights of that target
(or nothing was published yet), it emits one ``agents`` command for that
zone::

    payload = {"weights": {"rag", "tool", "llm"},            # sum 1
               "signals": {"stability", "rag_score", "tool_conf"},  # the EWMAs
               "paths": {"rag", "tool", "llm"}}               # this window's observed shares
                                                              # ({} when no request named its path)

with ``basis_ms`` = the window end, ``controller="agent_weights"`` and the
command's ``model`` the model.  Executors write it to the field
``_agents|<model>`` of ``<prefix>:routing:<zone>``
(:mod:`executors.backends`), where an agent orchestrator reads it and draws
each turn's path by the weights.  Values are rounded to 6 decimals, so a
restored worker issues the same ``command_id``.

A redelivered window (its end not newer than the target's last) is ignored.
:meth:`AgentWeightsDriver.snapshot` / :meth:`AgentWeightsDriver.restore` carry the
EWMAs, the published weights and the last window ends as JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controllers.agent_weights import AgentSignals, AgentWeightParams, weights
from controllers.window_record import WindowRecord
from core.settings import Settings
from core.vocab import AGENT_PATHS
from loop.breaker_driver import Target, fresh_zone_window
from loop.commands import Command
from loop.errors import SnapshotVersionError

log = logging.getLogger(__name__)

__all__ = ["EWMA_ALPHA", "PUBLISH_DELTA", "SNAPSHOT_VERSION", "AgentWeightsDriver", "parse_window"]

SNAPSHOT_VERSION = 1
EWMA_ALPHA = 0.3  # weight of the newest window's means (see the module docstring)
PUBLISH_DELTA = 0.05  # a weight must move by more than this to publish again
_MEANS = ("agent_stability_mean", "agent_rag_score_mean", "agent_tool_conf_mean")
_SIGNALS = ("stability", "rag_score", "tool_conf")


@dataclass(frozen=True)
class _Window:
    model: str
    zone: str
    end_ms: int
    n: int
    means: tuple[float, float, float]
    path_shares: dict[str, float]


def parse_window(w: WindowRecord) -> _Window | None:
    """The agent fields of a zone window (None: no request carried signals).

    ``ValueError`` says what is missing from a window that counts signals but
    carries no means.

    >>> from controllers.window_record import decode_window
    >>> w = parse_window(decode_window({"scope": "zone", "model": "m", "zone": "z", "window_end_ms": 10_000,
    ...                                 "agent_signals_n": 4, "agent_stability_mean": 0.9,
    ...                                 "agent_rag_score_mean": 0.9, "agent_tool_conf_mean": 0.2,
    ...                                 "agent_path_counts": {"rag": 3, "llm": 1}}))
    >>> w.means, w.path_shares
    ((0.9, 0.9, 0.2), {'rag': 0.75, 'tool': 0.0, 'llm': 0.25})
    """
    if w.agent_signals_n == 0:
        return None
    means = (w.agent_stability_mean, w.agent_rag_score_mean, w.agent_tool_conf_mean)
    for name, v in zip(_MEANS, means, strict=True):
        if v is None:
            raise ValueError(f"{name}: missing from a window with {w.agent_signals_n} agent signals")
    s, r, t = (float(v or 0.0) for v in means)
    counts = w.agent_path_counts
    total = sum(counts.values())
    shares = {p: round(counts.get(p, 0) / total, 6) for p in AGENT_PATHS} if total else {}
    return _Window(w.model, w.zone, w.window_end_ms, w.agent_signals_n, (s, r, t), shares)


class AgentWeightsDriver:
    """EWMA of each zone's agent signals -> weights (docs/model.md §15 (agents)) -> ``agents`` commands.

    Examples
    --------
    >>> d = AgentWeightsDriver.from_settings(Settings(zones=("az-a",)))
    >>> from dataclasses import replace
    >>> from controllers.window_record import decode_window
    >>> w = decode_window({"scope": "zone", "model": "m", "zone": "az-a", "window_end_ms": 10_000,
    ...                    "agent_signals_n": 5, "agent_stability_mean": 0.0, "agent_rag_score_mean": 0.9,
    ...                    "agent_tool_conf_mean": 0.8})
    >>> [c.payload["weights"] for c in d.on_window(w, 0)]      # a jumping conversation: tools
    [{'rag': 0.0, 'tool': 0.8, 'llm': 0.2}]
    >>> d.on_window(replace(w, window_end_ms=20_000), 0)         # the same signals: nothing new
    []
    """

    def __init__(
        self,
        command_ttl_s: float,
        params: AgentWeightParams | None = None,
        *,
        alpha: float = EWMA_ALPHA,
        min_delta: float = PUBLISH_DELTA,
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha={alpha!r}: must lie in (0, 1]")
        if not 0.0 <= min_delta < 1.0:
            raise ValueError(f"min_delta={min_delta!r}: must lie in [0, 1)")
        self.command_ttl_s = command_ttl_s
        self.params = params or AgentWeightParams()
        self.alpha = alpha
        self.min_delta = min_delta
        self.signals: dict[Target, tuple[float, float, float]] = {}
        self.published: dict[Target, dict[str, float]] = {}
        self.last_end_ms: dict[Target, int] = {}

    @classmethod
    def from_settings(
        cls, settings: Settings, params: AgentWeightParams | None = None, **kw: Any
    ) -> AgentWeightsDriver:
        """A driver with the settings' command TTL (the one setting it reads)."""
        return cls(settings.command_ttl_s, params, **kw)

    def on_window(self, record: WindowRecord, now_ms: int) -> list[Command]:
        """Feed one window record; returns the ``agents`` command to publish, if any."""
        w = fresh_zone_window(record, parse_window, self.last_end_ms, "agent weights")
        if w is None:
            return []
        target = (w.model, w.zone)
        prev = self.signals.get(target)
        a = self.alpha
        s, r, t = (
            w.means
            if prev is None
            else (  # clamped: rounding must not leave [0, 1]
                min(1.0, max(0.0, a * x + (1.0 - a) * p)) for x, p in zip(w.means, prev, strict=True)
            )
        )
        ewma = self.signals[target] = (s, r, t)
        signals = {k: round(v, 6) for k, v in zip(_SIGNALS, ewma, strict=True)}
        new = {k: round(v, 6) for k, v in weights(AgentSignals(*ewma), self.params).as_dict().items()}
        last = self.published.get(target)
        if last is not None and max(abs(new[k] - last[k]) for k in AGENT_PATHS) <= self.min_delta:
            return []
        self.published[target] = new
        ttl = int(self.command_ttl_s * 1000)
        reason = (
            "agent weights "
            + " ".join(f"{k} {v:.2f}" for k, v in new.items())
            + " from "
            + " ".join(f"{k} {v:.2f}" for k, v in signals.items())
        )
        return [
            Command(
                kind="agents",
                zone=w.zone,
                model=w.model,
                reason=reason,
                issued_at_ms=now_ms,
                expires_at_ms=now_ms + ttl,
                basis_ms=w.end_ms,
                controller="agent_weights",
                detail={"agent_signals_n": w.n},
                payload={"weights": new, "signals": signals, "paths": w.path_shares},
            )
        ]

    # -- snapshots ------------------------------------------------------------
    def snapshot(self, only: str | None = None) -> dict[str, Any]:
        """Every target's smoothed signals, published weights and last window end (plain data).

        ``only`` keeps one model's targets (the worker stores one snapshot per model).
        """
        targets = {
            f"{t[0]}|{t[1]}": {
                "signals": list(s),
                "published": self.published.get(t),
                "last_end_ms": self.last_end_ms.get(t, -1),
            }
            for t, s in sorted(self.signals.items())
            if only in (None, t[0])
        }
        return {"version": SNAPSHOT_VERSION, "targets": targets}

    def restore(self, data: Mapping[str, Any]) -> int:
        """Load a :meth:`snapshot` (all or nothing, merged into memory); returns the number of targets."""
        if data.get("version") != SNAPSHOT_VERSION:
            raise SnapshotVersionError(
                f"agent weights snapshot version {data.get('version')!r} (this worker: {SNAPSHOT_VERSION})"
            )
        signals: dict[Target, tuple[float, float, float]] = {}
        published: dict[Target, dict[str, float]] = {}
        last: dict[Target, int] = {}
        for key, d in data["targets"].items():
            model, _, zone = key.rpartition("|")
            s, r, t = (float(v) for v in d["signals"])
            signals[(model, zone)] = (s, r, t)
            if d["published"] is not None:
                published[(model, zone)] = {k: float(d["published"][k]) for k in AGENT_PATHS}
            last[(model, zone)] = int(d["last_end_ms"])
        self.signals.update(signals)  # all or nothing: built first, then merged
        self.published.update(published)
        self.last_end_ms.update(last)
        return len(signals)
