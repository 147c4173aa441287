"""The mixed-agent driver (loop.agent_weights_driver): zone windows with agent signals ->
EWMA -> weights (docs/model.md §15 (agents)) -> ``agents`` commands when a weight moves by
more than 0.05; the ``agents`` command's payload validation; restore-equivalence."""

from __future__ import annotations

from typing import Any

import pytest

from controllers.agent_weights import AgentSignals, weights
from controllers.window_record import WindowRecord, WindowRecordError, decode_window
from core.settings import Settings
from loop.agent_weights_driver import EWMA_ALPHA, PUBLISH_DELTA, AgentWeightsDriver
from loop.commands import Command, CommandError
from loop.errors import SnapshotVersionError
from streams.metrics_export import WorkerMetrics
from tests.unit.test_breaker_driver import assert_restores_alike, plain

S = Settings(zones=("az-a", "az-b"), command_ttl_s=30.0)
M = "llama2-70b"


def _raw(
    end_ms: int,
    s: float | None,
    r: float | None,
    t: float | None,
    *,
    zone: str = "az-a",
    n: int = 10,
    paths: dict[str, int] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    return {
        "kind": "window",
        "scope": "zone",
        "model": M,
        "zone": zone,
        "window_end_ms": end_ms,
        "agent_signals_n": n,
        "agent_stability_mean": s,
        "agent_rag_score_mean": r,
        "agent_tool_conf_mean": t,
        "agent_path_counts": paths or {"rag": 0, "tool": 0, "llm": 0},
        **kw,
    }


def _w(*args: Any, **kw: Any) -> WindowRecord:
    return decode_window(_raw(*args, **kw))


def test_the_first_window_with_signals_publishes_the_4_1_weights() -> None:
    d = AgentWeightsDriver.from_settings(S)
    (cmd,) = d.on_window(_w(10_000, 0.9, 0.9, 0.2, paths={"rag": 6, "tool": 1, "llm": 3}), 5_000)
    want = weights(AgentSignals(0.9, 0.9, 0.2)).as_dict()
    assert cmd.kind == "agents" and cmd.zone == "az-a" and cmd.model == M and cmd.controller == "agent_weights"
    assert cmd.basis_ms == 10_000 and cmd.issued_at_ms == 5_000 and cmd.expires_at_ms == 35_000
    assert cmd.payload["weights"] == pytest.approx(want, abs=1e-6)
    assert cmd.payload["signals"] == {"stability": 0.9, "rag_score": 0.9, "tool_conf": 0.2}
    assert cmd.payload["paths"] == {"rag": 0.6, "tool": 0.1, "llm": 0.3}
    assert Command.decode(cmd.encode()) == cmd
    # The same decision taken again (a restarted worker re-reading the window) has the same id.
    assert (
        AgentWeightsDriver.from_settings(S)
        .on_window(_w(10_000, 0.9, 0.9, 0.2, paths={"rag": 6, "tool": 1, "llm": 3}), 5_000)[0]
        .command_id
        == cmd.command_id
    )


_AGENT_FIELDS = ("agent_signals_n", "agent_stability_mean", "agent_rag_score_mean", "agent_tool_conf_mean")


@pytest.mark.parametrize(
    ("window", "why"),
    [
        (_w(10_000, 0.9, 0.9, 0.2, n=0), "no request carried signals"),
        (
            decode_window({k: v for k, v in _raw(10_000, 0.9, 0.9, 0.2).items() if k not in _AGENT_FIELDS}),
            "an older window without the fields",
        ),
        (_w(10_000, 0.9, 0.9, 0.2, scope="node", node="n1"), "a node window"),
        (_w(10_000, 0.9, None, 0.2), "a missing mean"),
    ],
)
def test_windows_without_usable_signals_publish_nothing(window: WindowRecord, why: str) -> None:
    d = AgentWeightsDriver.from_settings(S)
    assert d.on_window(window, 0) == [], why
    assert not d.signals


@pytest.mark.parametrize(
    ("window", "field"),
    [
        (_raw(10_000, 1.2, 0.9, 0.2), "agent_stability_mean"),  # a mean outside [0, 1]
        (_raw(10_000, 0.9, 0.9, 0.2, paths={"browse": 1}), "agent_path_counts"),  # an unknown path
        (_raw(10_000, 0.9, 0.9, 0.2, model=""), "model"),  # no model
        ({**_raw(10_000, 0.9, 0.9, 0.2), "agent_signals_n": None}, "agent_signals_n"),  # a null count
        ({**_raw(10_000, 0.9, 0.9, 0.2), "agent_signals_n": True}, "agent_signals_n"),  # not a count
    ],
)
def test_malformed_agent_fields_never_reach_the_driver(window: dict[str, Any], field: str) -> None:
    """The loop dead-letters them (tests/unit/test_window_record.py): decoding names the field."""
    with pytest.raises(WindowRecordError, match=f"^{field}:"):
        decode_window(window)


def test_no_command_while_the_weights_move_less_than_the_threshold() -> None:
    d = AgentWeightsDriver.from_settings(S)
    assert len(d.on_window(_w(10_000, 0.5, 0.5, 0.5), 0)) == 1
    # A small change: the EWMA moves 30 % of it, the weights less than 0.05.
    assert d.on_window(_w(20_000, 0.55, 0.5, 0.5), 0) == []
    assert d.on_window(_w(20_000, 0.0, 1.0, 1.0), 0) == []  # redelivered window end: ignored
    published = d.published[(M, "az-a")]
    # A jump towards a jumping conversation: tool weight moves by more than 0.05.
    (cmd,) = d.on_window(_w(30_000, 0.0, 0.5, 1.0), 0)
    assert max(abs(cmd.payload["weights"][k] - published[k]) for k in published) > PUBLISH_DELTA
    assert d.published[(M, "az-a")] == cmd.payload["weights"]
    # Other zones are independent targets: their first window publishes.
    assert [c.zone for c in d.on_window(_w(30_000, 0.5, 0.5, 0.5, zone="az-b"), 0)] == ["az-b"]


def test_the_signals_are_an_ewma_of_the_window_means() -> None:
    d = AgentWeightsDriver.from_settings(S)
    means = [(0.9, 0.9, 0.2), (0.1, 0.3, 0.8), (0.5, 0.5, 0.5), (1.0, 0.0, 1.0)]
    want = means[0]
    for i, m in enumerate(means):
        cmds = d.on_window(_w(10_000 * (i + 1), *m), 0)
        if i:
            want = tuple(EWMA_ALPHA * x + (1 - EWMA_ALPHA) * p for x, p in zip(m, want, strict=True))
        assert d.signals[(M, "az-a")] == pytest.approx(want, abs=1e-12)
        for c in cmds:  # a published command carries the EWMA and its weights
            assert list(c.payload["signals"].values()) == pytest.approx(want, abs=1e-6)
            assert c.payload["weights"] == pytest.approx(weights(AgentSignals(*want)).as_dict(), abs=1e-6)


def test_bad_driver_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="alpha"):
        AgentWeightsDriver.from_settings(S, alpha=0.0)
    with pytest.raises(ValueError, match="min_delta"):
        AgentWeightsDriver.from_settings(S, min_delta=1.0)


def _stream() -> list[WindowRecord]:
    """Two zones: converged, then jumping, then converged again (publishes along the way)."""
    out = []
    for i, (s, r, t) in enumerate([(0.9, 0.9, 0.2)] * 4 + [(0.1, 0.4, 0.9)] * 6 + [(0.8, 0.7, 0.3)] * 6):
        out += [
            _w(10_000 * (i + 1), s, r, t, paths={"rag": i, "tool": 1, "llm": 2}),
            _w(10_000 * (i + 1), 1 - s, r, t, zone="az-b"),
        ]
    return out


@pytest.mark.parametrize("cut", [1, 7, 12, 20])  # first window, mid-transition, boundaries
def test_a_restored_agent_weights_driver_decides_like_the_original(cut: int) -> None:
    rest = assert_restores_alike(
        lambda: AgentWeightsDriver.from_settings(S), lambda d, w: d.on_window(w, w.window_end_ms), _stream(), cut
    )
    assert rest  # every cut has publications ahead


def test_agent_weights_snapshot_of_another_version_is_ignored() -> None:
    d = AgentWeightsDriver.from_settings(S)
    d.on_window(_w(10_000, 0.9, 0.9, 0.2), 0)
    with pytest.raises(SnapshotVersionError):
        d.restore({"version": 99, "targets": {}})
    assert (M, "az-a") in d.signals
    assert AgentWeightsDriver.from_settings(S).restore(plain(d.snapshot())) == 1


P = {
    "weights": {"rag": 0.5, "tool": 0.2, "llm": 0.3},
    "signals": {"stability": 0.9, "rag_score": 0.9, "tool_conf": 0.2},
    "paths": {},
}


def _agents(payload: dict[str, Any]) -> Command:
    return Command(
        kind="agents",
        zone="az-a",
        model=M,
        reason="",
        issued_at_ms=0,
        expires_at_ms=1,
        basis_ms=10,
        payload=payload,
    )


@pytest.mark.parametrize(
    "payload",
    [
        {**P, "weights": {"rag": 0.5, "tool": 0.5}},  # a path missing
        {**P, "weights": {**P["weights"], "search": 0.1}},  # an unknown path
        {**P, "weights": {**P["weights"], "rag": -0.1}},  # negative
        {**P, "signals": {**P["signals"], "tool_conf": 1.5}},  # a signal above 1
        {**P, "signals": {**P["signals"], "stability": True}},  # not a number
        {k: v for k, v in P.items() if k != "paths"},  # no paths
        {**P, "paths": {"rag": "most"}},  # a share that is not a number
        {},  # nothing
    ],
)
def test_agents_payloads_are_validated(payload: dict[str, Any]) -> None:
    with pytest.raises(CommandError, match="agents payload"):
        _agents(payload)


def test_agents_command_id_hashes_the_payload() -> None:
    a = _agents(P)
    assert a.command_id.startswith("agents-") and a.order_field == f"agents:{M}"
    assert _agents({**P, "weights": {"rag": 0.4, "tool": 0.3, "llm": 0.3}}).command_id != a.command_id
    assert _agents({**P, "paths": {"rag": 1.0}}).command_id != a.command_id


def test_agent_weights_gauge() -> None:
    m = WorkerMetrics()
    m.observe_agent_weights(M, "az-a", P["weights"])
    assert m.registry.get_sample_value("governor_agent_weight", {"model": M, "zone": "az-a", "path": "tool"}) == 0.2
