"""The certificate with the settings' defaults, and the gate of gains that may be put in force.

:func:`certify_settings` is ``governor analyze gains``' check (:mod:`bench.analyze_gains`
prints it) over the measured plant-gain interval :data:`PLANT_GAIN_RANGE`; :func:`gate`
is the same check as a yes/no with its reasons, for the worker's online retuning
(:mod:`controllers.retune`): gains are put in force only when it accepts them.

The switching part of the certificate is an SDP and needs cvxpy (the ``bench``
extra, not the runtime image).  Where cvxpy is not importable the gate still
checks every margin of both modes over the interval (spectral radius, gain, phase
and delay margins) and accepts on those alone; the verdict says so
(``sdp=False``, ``note``).

>>> from core.settings import Settings
>>> v = gate({"kp": 0.0, "ki": 0.0235, "kd": 0.0, "ki_down": 0.0105}, Settings(), sdp=False)
>>> v.accepted, v.sdp
(True, False)
>>> v = gate({"kp": 0.3, "ki": 0.03}, Settings(), sdp=False)
>>> v.accepted, v.reasons[0]
(False, 'up: spectral radius 1.2079 >= 1 at b = 4.21')
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controllers.errors import ParameterError
from controllers.stability import PlantGainRange, RobustCertificate, robust_certificate
from core.settings import Settings

__all__ = ["DEFAULT_PLANT_GAIN", "PLANT_GAIN_RANGE", "GateVerdict", "certify_settings", "gate", "sdp_available"]

#: ``b = -d eps / d log(replicas)`` on azure-conv, 4 replicas, at the rate where
#: eps = 2 % (11.97 req/s), secant over +-5 %: ``python -m sim.plant_gain``
#: (docs/model.md §22 (certified)).  One point of :data:`PLANT_GAIN_RANGE`;
#: ``governor tune`` still certifies at it.
DEFAULT_PLANT_GAIN = 3.909

#: The interval the certificate holds over: the smallest and largest ``b`` that
#: ``python -m sim.plant_gain --range`` measured at 8c5b9fc (azure-conv, fixed fleets
#: of 4, 8 and 16 replicas at the rate where eps = 2 %, secants over +-2, 5 and 10 %,
#: seeds 0-2, 600 s; Mooncake has no such rate: with these fleets its violation rate
#: stays above 2 % at any load).  A 2-replica fleet measures 0.53-1.40: one replica is
#: half of it, outside the small-signal model; ``--plant-gain-range 0.534,4.21`` checks it.
PLANT_GAIN_RANGE = PlantGainRange(
    1.176,
    4.210,
    "measured by `python -m sim.plant_gain --range` (azure-conv, 4/8/16 replicas at eps = 2 %, "
    "secants +-2/5/10 %, seeds 0-2, 600 s)",
)


def certify_settings(
    gains: Mapping[str, Any],
    settings: Settings,
    *,
    plant_gain_range: PlantGainRange | None = None,
    delay_s: float | None = None,
    down_delay_s: float | None = None,
    dt_s: float | None = None,
    controller: str | None = None,
    dead_time_comp: bool | None = None,
    dwell_windows: int | None = None,
    sdp: bool = True,
) -> RobustCertificate:
    """:func:`controllers.stability.robust_certificate` with the settings' defaults
    filled in (the dwell: ``scale_down_dwell_windows``; -1 is the controller's shipped dwell,
    :data:`core.vocab.DEFAULT_DWELL_DELAYS` loop delays at the delay certified)."""
    dt = float(settings.window_s if dt_s is None else dt_s)
    ctrl = controller or settings.controller
    delay = float(settings.startup_hint_s + settings.window_s if delay_s is None else delay_s)
    # -1: the controller's shipped dwell, in loop delays (the law measures the start-up; here the delay given)
    dwell = settings.dwell_windows(delay, ctrl) if dwell_windows is None else dwell_windows
    return robust_certificate(
        gains,
        ctrl,
        PLANT_GAIN_RANGE if plant_gain_range is None else plant_gain_range,
        delay,
        dt,
        dead_time_comp=settings.dead_time_comp if dead_time_comp is None else dead_time_comp,
        down_delay_s=down_delay_s,
        time_scale_s=dt,
        dwell_windows=dwell,
        sdp=sdp,
    )


def sdp_available() -> bool:
    """Whether cvxpy (the switching certificate's SDP) can be imported here."""
    return importlib.util.find_spec("cvxpy") is not None


@dataclass(frozen=True)
class GateVerdict:
    """Whether gains may be put in force, and why not (``reasons``); ``sdp``: the switching was
    checked too (else the margins alone, ``note`` says so)."""

    accepted: bool
    reasons: tuple[str, ...]
    sdp: bool
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "reasons": list(self.reasons), "sdp": self.sdp, "note": self.note}


def gate(
    gains: Mapping[str, Any], settings: Settings, *, delay_s: float | None = None, sdp: bool | None = None
) -> GateVerdict:
    """The certificate of ``governor analyze gains`` as a gate (module docstring): ``sdp=None`` runs
    the SDP where cvxpy is importable; gains the controllers refuse are refused with their reason."""
    use_sdp = sdp_available() if sdp is None else sdp
    try:
        cert = certify_settings(gains, settings, delay_s=delay_s, sdp=use_sdp)
    except ParameterError as exc:
        return GateVerdict(False, (str(exc),), use_sdp)
    if use_sdp:
        return GateVerdict(cert.certified, tuple(cert.reasons), True)
    reasons = tuple(f"{m.mode}: {f}" for m in cert.modes for f in m.failures)
    note = "switching not checked (no SDP: cvxpy not importable); every margin of both modes checked"
    return GateVerdict(not reasons, reasons, False, note)
