"""One contract battery over every controller and driver (River's ``check_estimator`` style).

Each case below wraps one controller (a pure ``step`` over frozen parameters and
state) or one driver (``on_window`` over typed window records) behind the same
three calls -- ``feed(x) -> output``, ``state() -> plain data`` and
``load(data)`` -- and supplies a deterministic input stream, the clamps its
outputs must respect and parameter values that must be refused.  Every case
then has to pass the same checks:

- its state round-trips through JSON (plain data: no pickle, no NaN);
- a subject restored at any cut point decides exactly like the original;
- feeding an input changes neither the input nor the state object passed in;
- two fresh subjects given the same inputs decide the same (determinism);
- every output respects the case's clamps;
- a bad parameter raises a ``ValueError`` whose message names the parameter.

A new controller or driver joins the battery by adding one case.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from controllers import breaker as brk
from controllers import canary as can
from controllers import feedforward as ff
from controllers import fpid, pid
from controllers import kv_policy as kvp
from controllers import observer as obs
from controllers import routing as rt
from controllers import scaling_law as law
from controllers import zone_capacity as zc
from controllers.window_record import WindowRecord, decode_window
from core.settings import ModelSpec, Settings
from loop.agent_weights_driver import AgentWeightsDriver
from loop.breaker_driver import BreakerDriver
from loop.kv_policy_driver import KvPolicyDriver
from loop.routing_driver import RoutingDriver
from loop.scaler_driver import Scaler

GIB = 1 << 30


# -- the uniform wrapper -------------------------------------------------------------------
class Pure:
    """A pure controller: ``call(params, state, x) -> (state, output)`` over frozen state."""

    def __init__(
        self,
        params: Any,
        state: Any,
        call: Callable[[Any, Any, Any], tuple[Any, Any]],
        dump: Callable[[Any], Any],
        load: Callable[[Any], Any],
    ) -> None:
        self.params, self.st, self.call, self.dump, self.undump = params, state, call, dump, load

    def feed(self, x: Any) -> Any:
        before_state, before_x = self.dump(self.st), copy.deepcopy(x)
        state_obj = self.st
        self.st, out = self.call(self.params, state_obj, x)
        assert self.dump(state_obj) == before_state, "step changed the state it was given"
        assert x == before_x, "step changed its input"
        return out

    def state(self) -> Any:
        return self.dump(self.st)

    def load(self, data: Any) -> None:
        self.st = self.undump(data)


class DriverSubject:
    """A driver: ``on_window(record, now_ms) -> list[Command]``, ``snapshot()``, ``restore(data)``."""

    def __init__(self, driver: Any) -> None:
        self.d = driver

    def feed(self, w: WindowRecord) -> Any:
        before = w.to_dict()
        out = self.d.on_window(w, w.window_end_ms)
        assert w.to_dict() == before, "on_window changed its record"
        return out

    def state(self) -> Any:
        return self.d.snapshot()

    def load(self, data: Any) -> None:
        assert self.d.restore(data) >= 0


@dataclass
class Case:
    name: str
    make: Callable[[], Any]
    inputs: Callable[[], list[Any]]
    clamp: Callable[[Any], None]
    bad_params: list[tuple[Callable[[], Any], str]] = field(default_factory=list)


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


# -- controllers ---------------------------------------------------------------------------
PID = pid.PidParams(min_replicas=1, max_replicas=20)


def _pid_inputs() -> list[Any]:
    r = _rng()
    eps = np.concatenate([r.uniform(0, 0.01, 10), r.uniform(0.1, 0.6, 10), r.uniform(0, 0.03, 20)])
    return [pid.PidMeasurement(float(e), replicas_current=int(r.integers(1, 12)), replicas_pending=0) for e in eps]


def _in_range(lo: int, hi: int) -> Callable[[Any], None]:
    def check(out: Any) -> None:
        assert lo <= out.target_replicas <= hi, out

    return check


FPID = fpid.FpidParams(kp=0.2, ki=0.05, min_replicas=1, max_replicas=20, time_scale_s=10.0)
FF = ff.FeedforwardParams(capacity_rps=3.0, horizon_s=40.0)


def _ff_inputs() -> list[Any]:
    r = _rng()
    rates = np.concatenate([np.full(10, 10.0), np.full(10, 30.0), np.full(10, 12.0)]) + r.normal(0, 1, 30)
    return [
        ff.FeedforwardMeasurement(
            rate_rps=max(0.0, float(v)), queued=float(r.uniform(0, 20)), forecast_rps=None, forecast_error_rps=None
        )
        for v in rates
    ]


def _ff_clamp(out: Any) -> None:
    assert out.replicas >= 0 and math.isfinite(out.replicas), out


BRK = brk.BreakerParams(min_requests=100, open_s=20.0, max_open_s=80.0, probe_requests=5)


def _breaker_inputs() -> list[Any]:
    r = _rng()
    out = []
    for k in range(40):
        n = int(r.integers(50, 400))
        rate = 0.08 if 10 <= k < 16 else 0.001
        out.append((brk.BreakerObs(n, min(n, int(n * rate))), 10.0 * (k + 1)))
    return out


def _breaker_clamp(out: Any) -> None:
    assert out.state_name in ("closed", "open", "half_open"), out
    assert 0.0 <= out.error_ratio <= 1.0 and out.probe_budget >= 0, out


CANARY = can.CanaryParams(hold_s=20.0, min_requests_per_stage=50)


def _canary_inputs() -> list[Any]:
    r = _rng()
    out = []
    for k in range(40):
        n_c, n_s = int(r.integers(20, 80)), int(r.integers(500, 900))
        c = can.VersionObs(n_c, int(n_c * 0.001), float(r.uniform(300, 500)), p50_ms=200.0, p95_ms=350.0)
        s = can.VersionObs(n_s, 0, float(r.uniform(300, 500)), p50_ms=200.0, p95_ms=350.0)
        out.append((c, s, 10.0 * (k + 1)))
    return out


def _canary_clamp(out: Any) -> None:
    assert 0.0 <= out.traffic_share <= 1.0, out


KV = kvp.KvPolicyParams(max_bytes_per_round=GIB)


def _kv_inputs() -> list[Any]:
    r = _rng()
    out = []
    for k in range(30):
        free = int(r.integers(4, 12)) * GIB
        largest = int(free * r.uniform(0.1, 1.0))
        out.append(kvp.KvObs(largest, free, int(r.integers(0, 6)) * GIB, 1 - largest / free, k // 10, 8 * GIB))
    return out


def _kv_clamp(out: Any) -> None:
    assert 0 <= out.bytes_budget <= KV.max_bytes_per_round, out


ROUTING = rt.RoutingParams(primary="big", fallback="small")
_TARGETS = [rt.Target(v, z) for v in ("big", "small") for z in ("az-a", "az-b")]


def _routing_inputs() -> list[Any]:
    r = _rng()
    out = []
    for k in range(30):
        spike = 4.0 if 10 <= k < 18 else 1.0
        out.append(
            {
                t: rt.TargetObs(
                    ttft_p95_ms=float(r.uniform(300, 600)) * (spike if t.variant == "big" else 1.0),
                    e2e_p95_ms=float(r.uniform(3000, 6000)),
                    queue_len=float(r.uniform(0, 10)),
                    rate_rps=float(r.uniform(2, 10)),
                    capacity_rps=12.0,
                    breaker="closed",
                    forecast_rps=None,
                )
                for t in _TARGETS
            }
        )
    return out


def _routing_clamp(out: Any) -> None:
    for weights in out.weights.values():
        if weights:
            assert all(0.0 <= w <= 1.0 for w in weights.values()), weights
            assert math.isclose(sum(weights.values()), 1.0, abs_tol=1e-6), weights


ZONES = zc.ZoneCapacityParams(zones=("az-a", "az-b"), window_s=10.0, capacity_rps=3.0)


def _zone_inputs() -> list[Any]:
    out = []
    for k in range(40):
        out.append(("az-a", zc.ZoneWindow((k + 1) * 10_000, 8.0, 4, 0)))
        if not 12 <= k < 25:  # az-b goes dark for 13 windows, then heals
            out.append(("az-b", zc.ZoneWindow((k + 1) * 10_000, 8.0, 4 if k >= 25 else 4, 0)))
    return out


def _zone_call(p: Any, s: Any, x: Any) -> tuple[Any, Any]:
    state, events = zc.observe(p, s, x[0], x[1])
    return state, (events, zc.weights(p, state))


def _zone_clamp(out: Any) -> None:
    _events, weights = out
    assert all(0.0 <= w <= 1.0 for w in weights.values()), weights


KALMAN = obs.KalmanParams()


def _kalman_inputs() -> list[Any]:
    r = _rng()
    return [(float(r.uniform(0.2, 0.9)), float(r.uniform(0, 5)), float(r.uniform(0, 0.2))) for _ in range(30)]


def _kalman_call(p: Any, s: Any, z: Any) -> tuple[Any, Any]:
    state = obs.update(p, obs.KalmanState.initial(z) if s is None else s, z, 10.0)
    return state, obs.predict_ahead(p, state, 30.0)


def _kalman_clamp(out: Any) -> None:
    u, q, e = out
    assert 0.0 <= u <= 1.0 and q >= 0.0 and 0.0 <= e <= 1.0, out


def _opt_dump(s: Any) -> Any:
    return None if s is None else s.to_dict()


# The composed scaling law of one key (controllers.scaling_law): its state is the key's and the model's zone view.
def _law(**kw: Any) -> Pure:
    p = law.params_for(_settings(**kw), "big")
    return Pure(p, (p.new_state(), zc.ZoneCapacityState()), _law_call, _law_dump, _law_load)


def _law_call(p: Any, s: Any, w: WindowRecord) -> tuple[Any, Any]:
    state, zones, decision = law.decide(p, s[0], s[1], w, budget_cap=20)
    return (state, zones), decision


def _law_dump(s: Any) -> Any:
    return {"key": s[0].to_state(), "zones": s[1].to_dict()}


def _law_load(d: Any) -> Any:
    return law.ScalingState.from_state(d["key"]), zc.ZoneCapacityState.from_dict(d["zones"])


def _law_inputs() -> list[Any]:
    return [w for w in _zone_windows() if (w.model, w.zone) == ("big", "az-a")]


def _law_clamp(d: Any) -> None:
    assert 1 <= d.target <= 20, d  # within the model's replicas and the budget cap it was given
    assert 0.0 <= d.violation_rate <= 1.0 and d.zone_floor_rps >= 0.0


CONTROLLERS = [
    Case(
        "pid",
        lambda: Pure(
            PID, pid.PidState(), lambda p, s, m: pid.step(p, s, m, 10.0), pid.PidState.to_dict, pid.PidState.from_dict
        ),
        _pid_inputs,
        _in_range(1, 20),
        [
            (lambda: pid.PidParams(ki=-1.0), "ki"),
            (lambda: pid.PidParams(min_replicas=5, max_replicas=2), "replicas"),
            (lambda: pid.PidParams(eps_ref=1.5), "eps_ref"),
        ],
    ),
    Case(
        "fpid",
        lambda: Pure(
            FPID,
            fpid.FpidState(),
            lambda p, s, m: fpid.step(p, s, m, 10.0),
            fpid.FpidState.to_dict,
            fpid.FpidState.from_dict,
        ),
        _pid_inputs,
        _in_range(1, 20),
        [(lambda: fpid.FpidParams(alpha=2.5), "alpha"), (lambda: fpid.FpidParams(kp=0.1, ki=0.05, alpha=0.9), "ki")],
    ),
    Case(
        "feedforward",
        lambda: Pure(
            FF,
            ff.FeedforwardState(),
            lambda p, s, m: ff.step(p, s, m, 10.0),
            ff.FeedforwardState.to_dict,
            ff.FeedforwardState.from_dict,
        ),
        _ff_inputs,
        _ff_clamp,
        [
            (lambda: ff.FeedforwardParams(capacity_rps=0.0), "capacity_rps"),
            (lambda: ff.FeedforwardParams(capacity_rps=1.0, target_util=2.5), "target_util"),
        ],
    ),
    Case(
        "breaker",
        lambda: Pure(
            BRK,
            brk.BreakerState(),
            lambda p, s, x: brk.step(p, s, x[0], x[1]),
            brk.BreakerState.to_dict,
            brk.BreakerState.from_dict,
        ),
        _breaker_inputs,
        _breaker_clamp,
        [
            (lambda: brk.BreakerParams(base_error_ratio=1.5), "base_error_ratio"),
            (lambda: brk.BreakerParams(open_s=60.0, max_open_s=30.0), "max_open_s"),
        ],
    ),
    Case(
        "canary",
        lambda: Pure(
            CANARY,
            can.start(CANARY, 0.0),
            lambda p, s, x: can.step(p, s, x[0], x[1], x[2]),
            can.CanaryState.to_dict,
            can.CanaryState.from_dict,
        ),
        _canary_inputs,
        _canary_clamp,
        [(lambda: can.CanaryParams(max_error_rate=2.0), "max_error_rate")],
    ),
    Case(
        "kv_policy",
        lambda: Pure(KV, kvp.KvPolicyState(), kvp.step, kvp.KvPolicyState.to_dict, kvp.KvPolicyState.from_dict),
        _kv_inputs,
        _kv_clamp,
        [(lambda: kvp.KvPolicyParams(trigger_factor=-1.0), "trigger_factor")],
    ),
    Case(
        "routing",
        lambda: Pure(
            ROUTING,
            rt.RoutingState(),
            lambda p, s, x: rt.step(p, s, x, rt.DEFAULT_CLASSES, 10.0),
            rt.RoutingState.to_dict,
            rt.RoutingState.from_dict,
        ),
        _routing_inputs,
        _routing_clamp,
        [(lambda: rt.RoutingParams(primary="a", fallback="a"), "fallback")],
    ),
    Case(
        "zone_capacity",
        lambda: Pure(
            ZONES, zc.ZoneCapacityState(), _zone_call, zc.ZoneCapacityState.to_dict, zc.ZoneCapacityState.from_dict
        ),
        _zone_inputs,
        _zone_clamp,
        [(lambda: zc.ZoneCapacityParams(zones=("a", "b"), window_s=0.0), "window_s")],
    ),
    Case(
        "kalman_observer",
        lambda: Pure(
            KALMAN, None, _kalman_call, _opt_dump, lambda d: None if d is None else obs.KalmanState.from_dict(d)
        ),
        _kalman_inputs,
        _kalman_clamp,
        [(lambda: obs.LoopDelay(weight=0.0), "weight")],
    ),
    Case(
        "scaling_law",
        _law,
        _law_inputs,
        _law_clamp,
        [
            (lambda: dataclasses.replace(law.params_for(_settings(), "big"), eps_ref=0.0), "eps_ref"),
            (lambda: dataclasses.replace(law.params_for(_settings(), "big"), horizon_steps=0), "horizon_steps"),
        ],
    ),
    Case(
        "scaling_law_fpid_observer",
        lambda: _law(controller="fpid", observer=True, learn_capacity=True, pid_gains={"kp": 0.2, "ki": 0.05}),
        _law_inputs,
        _law_clamp,
        [(lambda: dataclasses.replace(law.params_for(_settings(), "big"), window_s=-1.0), "window_s")],
    ),
]


# -- drivers -------------------------------------------------------------------------------
def _settings(**kw: Any) -> Settings:
    spec = ModelSpec("big", min_replicas=1, max_replicas=24, replica_capacity_rps=3.0)
    return Settings(
        zones=("az-a", "az-b"),
        models=(spec, ModelSpec("small", max_replicas=24)),
        fallbacks=(("big", "small"),),
        breaker_min_requests=100,
        **kw,
    )


def _zone_windows() -> list[WindowRecord]:
    r = _rng()
    out = []
    for k in range(36):
        for model in ("big", "small"):
            for zone in ("az-a", "az-b"):
                n = int(r.integers(200, 600))
                step = 2.5 if 12 <= k < 24 else 1.0
                out.append(
                    decode_window(
                        {
                            "scope": "zone",
                            "model": model,
                            "zone": zone,
                            "window_start_ms": k * 10_000,
                            "window_end_ms": (k + 1) * 10_000,
                            "window_s": 10.0,
                            "count": n,
                            "rate_rps": n * step / 10.0,
                            "violation_rate": float(min(1.0, r.uniform(0, 0.05) * step**2)),
                            "error_rate": 0.09 if (model, 8 <= k < 14) == ("small", True) else 0.001,
                            "ttft_p50_ms": float(r.uniform(150, 300)),
                            "ttft_p95_ms": float(r.uniform(400, 900) * step),
                            "ttft_p99_ms": float(r.uniform(900, 1400) * step),
                            "e2e_p95_ms": float(r.uniform(4000, 9000)),
                            "queue_len_mean": float(r.uniform(0, 6) * step),
                            "gpu_util_mean": float(r.uniform(0.3, 0.95)),
                            "replicas_ready": int(r.integers(3, 9)),
                            "replicas_starting": int(r.integers(0, 2)),
                            "agent_signals_n": 20,
                            "agent_stability_mean": float(r.uniform(0, 1)),
                            "agent_rag_score_mean": float(r.uniform(0, 1)),
                            "agent_tool_conf_mean": float(r.uniform(0, 1)),
                            "agent_path_counts": {"rag": 8, "tool": 7, "llm": 5},
                        }
                    )
                )
    return out


def _node_windows() -> list[WindowRecord]:
    r = _rng()
    out = []
    for k in range(30):
        for node in ("n1", "n2"):
            free = int(r.integers(4, 12)) * GIB
            largest = int(free * r.uniform(0.1, 1.0))
            out.append(
                decode_window(
                    {
                        "scope": "node",
                        "model": "big",
                        "zone": "az-a",
                        "node": node,
                        "window_end_ms": (k + 1) * 10_000,
                        "window_s": 10.0,
                        "replicas_ready": 1,
                        "largest_free_block_bytes": largest,
                        "kv_free_bytes": free,
                        "kv_waiting_bytes": int(r.integers(0, 6)) * GIB,
                        "fragmentation_ratio": 1 - largest / free,
                        "kv_generation": k // 10,
                    }
                )
            )
    return out


def brk_out(payload: dict[str, Any]) -> Any:
    """A breaker command's payload read as the controller's output (for its clamps)."""
    return brk.BreakerOutput(payload["state"], True, 0.0, float(payload["error_ratio"]), "")


def _commands_clamp(kind: str, check: Callable[[Any], None] | None = None) -> Callable[[Any], None]:
    def clamp(cmds: Any) -> None:
        for c in cmds:
            assert c.kind == kind, c
            if check is not None:
                check(c)

    return clamp


def _scale_in_bounds(c: Any) -> None:
    assert 1 <= c.target_replicas <= 24, c


def _weights_sum_to_one(c: Any) -> None:
    w = c.payload["weights"]
    assert all(0.0 <= v <= 1.0 for v in w.values()) and math.isclose(sum(w.values()), 1.0, abs_tol=1e-5), w


DRIVERS = [
    Case(
        "scaler",
        lambda: DriverSubject(Scaler(_settings())),
        _zone_windows,
        _commands_clamp("scale", _scale_in_bounds),
        [(lambda: _settings(eps_ref=0.0), "GOVERNOR_EPS_REF")],
    ),
    Case(
        "scaler_fpid_observer",
        lambda: DriverSubject(Scaler(_settings(controller="fpid", observer=True, pid_gains={"kp": 0.2, "ki": 0.05}))),
        _zone_windows,
        _commands_clamp("scale", _scale_in_bounds),
        [(lambda: _settings(controller="pi"), "GOVERNOR_CONTROLLER")],
    ),
    Case(
        "breaker_driver",
        lambda: DriverSubject(BreakerDriver.from_settings(_settings())),
        _zone_windows,
        _commands_clamp("breaker", lambda c: _breaker_clamp(brk_out(c.payload))),
        [(lambda: BreakerDriver.from_settings(_settings(), brk.BreakerParams(min_requests=-1)), "min_requests")],
    ),
    Case(
        "routing_driver",
        lambda: DriverSubject(RoutingDriver.from_settings(_settings())),
        _zone_windows,
        _commands_clamp("route"),
        [(lambda: Settings.from_env({"GOVERNOR_FALLBACKS": "big=big"}), "GOVERNOR_FALLBACKS")],
    ),
    Case(
        "agent_weights_driver",
        lambda: DriverSubject(AgentWeightsDriver.from_settings(_settings())),
        _zone_windows,
        _commands_clamp("agents", _weights_sum_to_one),
        [
            (lambda: AgentWeightsDriver.from_settings(_settings(), alpha=0.0), "alpha"),
            (lambda: AgentWeightsDriver.from_settings(_settings(), min_delta=1.0), "min_delta"),
        ],
    ),
    Case(
        "kv_policy_driver",
        lambda: DriverSubject(KvPolicyDriver(kvp.KvPolicyParams(max_bytes_per_round=GIB))),
        _node_windows,
        _commands_clamp("relocate", lambda c: _kv_clamp(type("D", (), {"bytes_budget": c.payload["max_bytes"]}))),
        [(lambda: KvPolicyDriver(kvp.KvPolicyParams(max_bytes_per_round=-1)), "max_bytes_per_round")],
    ),
]

CASES = CONTROLLERS + DRIVERS
IDS = [c.name for c in CASES]


def _outputs(subject: Any, inputs: list[Any]) -> list[Any]:
    return [subject.feed(x) for x in inputs]


def _plain(data: Any) -> Any:
    """Round-trip through strict JSON: fails on anything that is not plain data (or NaN)."""
    return json.loads(json.dumps(data, allow_nan=False))


# -- the battery ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_state_round_trips_through_plain_data(case: Case) -> None:
    inputs = case.inputs()
    s = case.make()
    _outputs(s, inputs[: len(inputs) // 2])
    data = _plain(s.state())
    fresh = case.make()
    fresh.load(data)
    assert _plain(fresh.state()) == data


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("cut", [0.1, 0.35, 0.6, 0.9])
def test_a_restored_subject_decides_like_the_original(case: Case, cut: float) -> None:
    inputs = case.inputs()
    k = int(len(inputs) * cut)
    original = case.make()
    _outputs(original, inputs[:k])
    restored = case.make()
    restored.load(_plain(original.state()))
    assert _outputs(restored, inputs[k:]) == _outputs(original, inputs[k:])
    assert _plain(restored.state()) == _plain(original.state())


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_decisions_are_deterministic_and_within_clamps(case: Case) -> None:
    inputs = case.inputs()
    a, b = case.make(), case.make()
    outs = _outputs(a, inputs)
    assert outs == _outputs(b, inputs)
    assert _plain(a.state()) == _plain(b.state())
    for out in outs:
        case.clamp(out)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_stream_exercises_the_subject(case: Case) -> None:
    # A battery over a stream that never moves the subject could not fail: the state must change.
    s = case.make()
    before = _plain(s.state())
    _outputs(s, case.inputs())
    assert _plain(s.state()) != before


@pytest.mark.parametrize(
    ("case", "make", "name"), [(c, m, n) for c in CASES for m, n in c.bad_params], ids=lambda v: getattr(v, "name", "")
)
def test_a_parameter_error_names_the_parameter(case: Case, make: Callable[[], Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        make()


def test_every_case_names_at_least_one_bad_parameter() -> None:
    assert all(c.bad_params for c in CASES), [c.name for c in CASES if not c.bad_params]


@pytest.mark.parametrize("case", DRIVERS, ids=[c.name for c in DRIVERS])
def test_each_driver_stream_produces_commands(case: Case) -> None:
    # The clamps above only bind if the stream makes the driver act.
    assert sum(len(cmds) for cmds in _outputs(case.make(), case.inputs())) > 0
