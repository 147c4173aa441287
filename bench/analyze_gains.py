"""``governor analyze gains GAINS_FILE``: the robust certificate of the scaling
loop (docs/model.md §22 (certified); :mod:`controllers.stability`).

The gains come from a gains file (``{"gains": {...}}`` as ``governor tune``
writes it, or a bare object; the scale-down gains ``kp_down``, ``ki_down``,
``kd_down`` where they differ) or, with ``--shipped``, from the defaults of
the selected controller.  The plant gain is an interval,
:data:`PLANT_GAIN_RANGE`, measured on the fast simulator (the command is in
its ``source``; a few minutes, so not repeated per call);
``--plant-gain-range LO,HI`` overrides it and ``--plant-gain B`` takes the
single point ``B``.  The loop delay is ``startup_hint_s + window_s``, the
window ``window_s``, the dwell the controller enforces
``scale_down_dwell_windows`` (``--dwell-windows`` overrides).  Exit 0 when
certified, 1 when not (each failing margin or the switching is printed with
where it fails), 2 on a bad file or argument (the message names the field).
"""

from __future__ import annotations

import json
import math
import time
from argparse import Namespace
from typing import Any

from controllers.errors import ParameterError
from controllers.fpid import FpidParams
from controllers.gain_certificate import DEFAULT_PLANT_GAIN, PLANT_GAIN_RANGE, certify_settings
from controllers.stability import (
    REQUIRED_DELAY_MARGIN_WINDOWS,
    REQUIRED_GAIN_MARGIN,
    REQUIRED_PHASE_MARGIN_DEG,
    PlantGainRange,
    RobustCertificate,
)
from core.vocab import DEFAULT_PID_GAINS

__all__ = [
    "DEFAULT_PLANT_GAIN",
    "PLANT_GAIN_RANGE",
    "PROPOSED_DWELL_WINDOWS",
    "PROPOSED_GAINS",
    "GainsFileError",
    "add_parser",
    "certify_settings",
    "load_gains",
    "parse_range",
    "render",
]

#: The gains proposed as shipped defaults, certified over :data:`PLANT_GAIN_RANGE`
#: (docs/model.md §22 (certified), "Proposed defaults").  pid: integral only, the
#: scale-up gain as strong as the up mode's gain margin allows at the top of the
#: range (``b ki dt <= 1``), the scale-down gain as strong as the down mode's
#: delay margin allows there.  fpid (``h = 1``, so ``ki`` is per window): ``kp``
#: as large as the gain margin allows, ``ki`` just under fpid's ``ki/kp < alpha/2``,
#: ``alpha = 1`` and the adaptation pinned there (a fractional order keeps all 64
#: weights: the switching SDP would not finish in seconds).
PROPOSED_GAINS: dict[str, dict[str, float]] = {
    "pid": {"kp": 0.0, "ki": 0.0235, "kd": 0.0, "ki_down": 0.0105},
    "fpid": {"kp": 0.08, "ki": 0.039, "kd": 0.0, "alpha": 1.0, "alpha_lo": 1.0, "alpha_hi": 1.0, "memory": 64.0},
}

#: The dwell (windows after a scale-up before a scale-down, ``scale_down_dwell_windows``)
#: each proposal's certificate needs over :data:`PLANT_GAIN_RANGE`: no common quadratic
#: Lyapunov function of both modes exists there, so the switching is certified by a dwell.
PROPOSED_DWELL_WINDOWS = {"pid": 11, "fpid": 46}

_MAX_FILE_BYTES = 1 << 20


class GainsFileError(ValueError):
    """The gains file is unusable; the message names the field."""


def load_gains(path: str) -> dict[str, float]:
    """The ``gains`` object of a gains file, each value a finite number."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise GainsFileError(f"{path}: {exc.strerror or exc}") from None
    if len(raw) > _MAX_FILE_BYTES:
        raise GainsFileError(f"{path}: larger than {_MAX_FILE_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GainsFileError(f"{path}: not JSON ({exc})") from None
    gains = doc.get("gains", doc) if isinstance(doc, dict) else doc
    if not isinstance(gains, dict):
        raise GainsFileError(f"{path}: gains: need a JSON object of numbers")
    out: dict[str, float] = {}
    for key, value in gains.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise GainsFileError(f"{path}: gains.{key}={value!r}: need a finite number")
        out[str(key)] = float(value)
    return out


def shipped_gains(controller: str) -> dict[str, float]:
    """The defaults of ``controller`` (pid: core.vocab; fpid: FpidParams), with
    the scale-down gains and fpid's alpha bounds where the parameters have them."""
    if controller == "fpid":
        p = FpidParams()
        names = ("kp", "ki", "kd", "kp_down", "ki_down", "kd_down", "alpha", "eta", "alpha_lo", "alpha_hi")
        out = {k: float(getattr(p, k)) for k in names if getattr(p, k, None) is not None}
        return {**out, "memory": float(p.memory)}
    return dict(DEFAULT_PID_GAINS)


def parse_range(text: str) -> PlantGainRange:
    """``LO,HI`` (``--plant-gain-range``) as a :class:`PlantGainRange`."""
    parts = text.split(",")
    try:
        lo, hi = (float(x) for x in parts)
    except ValueError:
        raise ParameterError(f"plant_gain_range={text!r}: need LO,HI (two numbers)") from None
    return PlantGainRange(lo, hi, f"--plant-gain-range {text}")


def _fmt(x: float | None, spec: str) -> str:
    return "inf" if x is None or not math.isfinite(x) else format(x, spec)


def render(cert: RobustCertificate) -> str:
    """The tables: per mode the worst margins over the interval and where, the
    spectral radius at its ends; then the switching."""
    r = cert.plant_gain_range
    lines = [
        f"plant gain b in [{r.lo:g}, {r.hi:g}]: {r.source}",
        f"required at every b: gain margin >= {REQUIRED_GAIN_MARGIN:g} ({20 * math.log10(REQUIRED_GAIN_MARGIN):.0f} dB), "
        f"phase margin >= {REQUIRED_PHASE_MARGIN_DEG:g} deg, delay margin >= {REQUIRED_DELAY_MARGIN_WINDOWS:g} windows",
    ]
    if cert.alpha_note:
        lines.append(f"orders: {cert.alpha_note}")
    lines.append(
        f"{'mode':<5} {'loop':<12} {'delay':>10}  {'gain margin (at b)':<20} {'phase margin (at b)':<22} "
        f"{'delay margin (at b)':<21} {'radius at lo, hi':<16}"
    )
    for m in cert.modes:
        loop = "compensated" if m.compensated else "plain"

        def at(w: Any, spec: str, unit: str = "") -> str:
            return f"{_fmt(w.value, spec)}{unit} ({w.plant_gain:.3g})"

        lines.append(
            f"{m.mode:<5} {loop:<12} {m.delay_s:>6g} s {m.delay_windows:>1}w  {at(m.gain_margin, '.3f'):<20} "
            f"{at(m.phase_margin_deg, '.1f', ' deg'):<22} {at(m.delay_margin_windows, '.2f', ' w'):<21} "
            f"{m.spectral_radius_ends[0]:.4f}, {m.spectral_radius_ends[1]:.4f}"
        )
    sw = cert.switching
    if sw.kind == "common" and sw.rho is not None:
        lines.append(
            f"switching: a common quadratic Lyapunov function of both modes at both ends "
            f"(state {sw.order}, {sw.vertices} vertices): V falls by rho^2 = {sw.rho**2:.4f} a window, "
            f"cond(P) {sw.cond_p:.3g}"
        )
    elif sw.kind == "dwell":
        lines.append(
            f"switching: no common quadratic Lyapunov function; per-mode functions need a dwell of "
            f"{sw.dwell_windows_needed} windows in the up mode (mu {sw.mu:.3g}, rho_up {sw.rho:.4f}); "
            f"the controller enforces {sw.dwell_windows_enforced} (scale_down_dwell_windows)"
        )
    else:
        lines.append(f"switching: not certified: {sw.why}")
    for why in cert.reasons:
        lines.append(f"NOT CERTIFIED: {why}")
    return "\n".join(lines)


def add_parser(asub: Any) -> None:
    g = asub.add_parser("gains", help="the robust certificate of the scaling gains (margins, switching)")
    g.add_argument("gains_file", nargs="?", help="gains JSON (as `governor tune` writes it)")
    g.add_argument("--shipped", action="store_true", help="the selected controller's default gains")
    g.add_argument("--controller", choices=("pid", "fpid"), help="default GOVERNOR_CONTROLLER")
    g.add_argument(
        "--plant-gain-range",
        help=f"LO,HI: the interval of b = -d eps / d log replicas (default {PLANT_GAIN_RANGE.lo:g},{PLANT_GAIN_RANGE.hi:g})",
    )
    g.add_argument("--plant-gain", type=float, help="one b (the interval [b, b])")
    g.add_argument("--delay-s", type=float, help="loop delay (default startup_hint_s + window_s)")
    g.add_argument("--down-delay-s", type=float, help="scale-down delay (default window_s)")
    g.add_argument("--dt-s", type=float, help="control period (default window_s)")
    g.add_argument("--dwell-windows", type=int, help="dwell enforced before a scale-down (default the settings')")
    g.add_argument("--no-dead-time-comp", action="store_true", help="the up mode is the plain loop")
    g.add_argument("--json", action="store_true", help="print JSON")
    g.set_defaults(run=run)


def run(settings: Any, args: Namespace) -> int:
    controller = args.controller or settings.controller
    if bool(args.shipped) == bool(args.gains_file):
        print("governor analyze gains: give a GAINS_FILE or --shipped (one of them)")
        return 2
    try:
        if args.plant_gain_range is not None and args.plant_gain is not None:
            raise ParameterError("plant_gain_range: give --plant-gain-range or --plant-gain, not both")
        rng = (
            parse_range(args.plant_gain_range)
            if args.plant_gain_range is not None
            else PlantGainRange(args.plant_gain, args.plant_gain, f"--plant-gain {args.plant_gain:g}")
            if args.plant_gain is not None
            else None
        )
        gains = shipped_gains(controller) if args.shipped else load_gains(args.gains_file)
        t0 = time.perf_counter()
        cert = certify_settings(
            gains,
            settings,
            plant_gain_range=rng,
            delay_s=args.delay_s,
            down_delay_s=args.down_delay_s,
            dt_s=args.dt_s,
            controller=controller,
            dead_time_comp=False if args.no_dead_time_comp else None,
            dwell_windows=args.dwell_windows,
        )
    except (GainsFileError, ParameterError) as exc:
        print(f"governor analyze gains: {exc}")
        return 2
    elapsed_s = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"gains": gains, **cert.to_dict(), "elapsed_s": round(elapsed_s, 3)}, indent=2))
    else:
        src = "shipped defaults" if args.shipped else args.gains_file
        print(f"{controller} gains {gains} ({src})")
        print(render(cert))
        print(f"(margins over {len(cert.plant_gain_range.grid())} plant gains and the SDP: {elapsed_s:.2f} s)")
        print("certified" if cert.certified else "not certified")
    return 0 if cert.certified else 1
