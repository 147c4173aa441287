"""``governor analyze gains GAINS_FILE``: margins and a Lyapunov certificate of
the scaling loop linearised around an operating point (docs/model.md §22
(certified); :mod:`controllers.stability`).

The gains come from a gains file (``{"gains": {...}}`` as ``governor tune``
writes it, or a bare object) or, with ``--shipped``, from the defaults of the
selected controller.  The plant gain defaults to :data:`DEFAULT_PLANT_GAIN`,
measured once on the fast simulator (``python -m sim.plant_gain``; too slow to
repeat on every call); the loop delay to ``startup_hint_s + window_s`` and the
window to ``window_s``.  Exit 0 when every mode is certified, 1 when one is
not (the reason is printed), 2 on a bad file or argument (the message names
the field).
"""

from __future__ import annotations

import json
import math
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from controllers.errors import ParameterError
from controllers.fpid import FpidParams
from controllers.stability import Assessment, OperatingPoint, assess
from core.vocab import DEFAULT_PID_GAINS

__all__ = ["DEFAULT_PLANT_GAIN", "GainsFileError", "add_parser", "certify_settings", "load_gains", "render"]

#: ``b = -d eps / d log(replicas)`` on azure-conv, 4 replicas, at the rate where
#: eps = 2 % (11.97 req/s), secant over +-5 %: ``python -m sim.plant_gain``
#: (docs/model.md §22 (certified)).
DEFAULT_PLANT_GAIN = 3.909

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
    """The defaults of ``controller`` (pid: core.vocab; fpid: FpidParams)."""
    if controller == "fpid":
        p = FpidParams()
        return {"kp": p.kp, "ki": p.ki, "kd": p.kd, "alpha": p.alpha, "memory": float(p.memory)}
    return dict(DEFAULT_PID_GAINS)


def certify_settings(
    gains: Mapping[str, Any],
    settings: Any,
    *,
    plant_gain: float = DEFAULT_PLANT_GAIN,
    delay_s: float | None = None,
    down_delay_s: float | None = None,
    dt_s: float | None = None,
    controller: str | None = None,
    dead_time_comp: bool | None = None,
) -> list[Assessment]:
    """:func:`controllers.stability.assess` with the settings' defaults filled in."""
    dt = float(settings.window_s if dt_s is None else dt_s)
    return assess(
        gains,
        controller or settings.controller,
        OperatingPoint(plant_gain=plant_gain),
        float(settings.startup_hint_s + settings.window_s if delay_s is None else delay_s),
        dt,
        dead_time_comp=settings.dead_time_comp if dead_time_comp is None else dead_time_comp,
        down_delay_s=down_delay_s,
        time_scale_s=dt,
    )


def _fmt(x: float | None, spec: str) -> str:
    return "inf" if x is None or not math.isfinite(x) else format(x, spec)


def render(assessments: list[Assessment]) -> str:
    """Human-readable lines, one block per mode."""
    lines = []
    for a in assessments:
        head = f"{a.mode:<6} delay {a.delay_s:g} s ({a.delay_windows} windows)  spectral radius {a.spectral_radius:.4f}"
        lines.append(head)
        if a.margins is not None:
            m = a.margins
            lines.append(
                f"       gain margin {_fmt(m.gain_margin, '.3f')} ({_fmt(m.gain_margin_db, '.1f')} dB)  "
                f"phase margin {_fmt(m.phase_margin_deg, '.1f')} deg  "
                f"delay margin {_fmt(m.delay_margin_windows, '.2f')} windows"
            )
        c = a.certificate
        if c is None:
            lines.append(f"       NOT CERTIFIED: {a.why}")
        else:
            lines.append(
                f"       certified: rho {c.rho:.4f}  alpha {c.alpha_per_s:.4g} /s  beta {c.beta:.3g}  (P {c.order}x{c.order})"
            )
    return "\n".join(lines)


def add_parser(asub: Any) -> None:
    g = asub.add_parser("gains", help="gain/phase margins and a Lyapunov certificate of the scaling gains")
    g.add_argument("gains_file", nargs="?", help="gains JSON (as `governor tune` writes it)")
    g.add_argument("--shipped", action="store_true", help="the selected controller's default gains")
    g.add_argument("--controller", choices=("pid", "fpid"), help="default GOVERNOR_CONTROLLER")
    g.add_argument("--plant-gain", type=float, default=DEFAULT_PLANT_GAIN, help="b = -d eps / d log replicas")
    g.add_argument("--delay-s", type=float, help="loop delay (default startup_hint_s + window_s)")
    g.add_argument("--down-delay-s", type=float, help="scale-down delay (default window_s)")
    g.add_argument("--dt-s", type=float, help="control period (default window_s)")
    g.add_argument("--no-dead-time-comp", action="store_true", help="certify the plain loop only")
    g.add_argument("--json", action="store_true", help="print JSON")
    g.set_defaults(run=run)


def run(settings: Any, args: Namespace) -> int:
    controller = args.controller or settings.controller
    if bool(args.shipped) == bool(args.gains_file):
        print("governor analyze gains: give a GAINS_FILE or --shipped (one of them)")
        return 2
    try:
        gains = shipped_gains(controller) if args.shipped else load_gains(args.gains_file)
        found = certify_settings(
            gains,
            settings,
            plant_gain=args.plant_gain,
            delay_s=args.delay_s,
            down_delay_s=args.down_delay_s,
            dt_s=args.dt_s,
            controller=controller,
            dead_time_comp=False if args.no_dead_time_comp else None,
        )
    except (GainsFileError, ParameterError) as exc:
        print(f"governor analyze gains: {exc}")
        return 2
    ok = all(a.certificate is not None for a in found)
    if args.json:
        print(
            json.dumps(
                {
                    "controller": controller,
                    "gains": gains,
                    "plant_gain": args.plant_gain,
                    "certified": ok,
                    "modes": [a.to_dict() for a in found],
                },
                indent=2,
            )
        )
    else:
        src = "shipped defaults" if args.shipped else args.gains_file
        print(f"{controller} gains {gains} ({src}), plant gain b = {args.plant_gain:g}")
        print(render(found))
        print("certified" if ok else "not certified")
    return 0 if ok else 1
