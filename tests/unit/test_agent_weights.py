"""Mixed agent load weights (docs/model.md §15 (agents)): hand-worked values, normalisation, allocation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers.agent_weights import (
    STATIC_WEIGHTS,
    AgentSignals,
    AgentWeightParams,
    AgentWeights,
    allocate,
    weights,
)
from controllers.errors import ParameterError

unit = st.floats(0.0, 1.0)


@pytest.mark.parametrize(
    ("stability", "rag", "tool", "raw", "norm"),
    [
        # converged, relevant context: 0.4*1*1=0.4, tool 0, llm 0.1+0.2=0.3 -> 4/7, 0, 3/7
        (1.0, 1.0, 1.0, (0.4, 0.0, 0.3), (4 / 7, 0.0, 3 / 7)),
        # jumping conversation: rag 0, tool 0.5*0.8=0.4, llm 0.1 -> 0.8, 0.2
        (0.0, 0.9, 0.8, (0.0, 0.4, 0.1), (0.0, 0.8, 0.2)),
        # half way: rag 0.4*0.5*0.5=0.1, tool 0.5*0.4*0.5=0.1, llm 0.2 -> 0.25, 0.25, 0.5
        (0.5, 0.5, 0.4, (0.1, 0.1, 0.2), (0.25, 0.25, 0.5)),
        # nothing retrieved, no tool confidence: LLM only (llm_base > 0 keeps it defined)
        (0.3, 0.0, 0.0, (0.0, 0.0, 0.16), (0.0, 0.0, 1.0)),
    ],
)
def test_article_formulas(stability, rag, tool, raw, norm) -> None:
    w = weights(AgentSignals(stability=stability, rag_score=rag, tool_conf=tool))
    assert (w.raw_rag, w.raw_tool, w.raw_llm) == pytest.approx(raw)
    assert (w.rag, w.tool, w.llm) == pytest.approx(norm)


def test_custom_coefficients() -> None:
    p = AgentWeightParams(rag_coef=1.0, tool_coef=1.0, llm_base=1.0, llm_stability_coef=0.0)
    w = weights(AgentSignals(stability=0.5, rag_score=1.0, tool_conf=1.0), p)
    # raw 0.5, 0.5, 1.0 -> 0.25, 0.25, 0.5
    assert (w.rag, w.tool, w.llm) == pytest.approx((0.25, 0.25, 0.5))


def test_static_reference_is_one_to_one_to_one() -> None:
    assert STATIC_WEIGHTS.as_dict() == pytest.approx({"rag": 1 / 3, "tool": 1 / 3, "llm": 1 / 3})


@pytest.mark.parametrize(
    ("total", "w", "expected"),
    [
        (9, STATIC_WEIGHTS, {"rag": 3, "tool": 3, "llm": 3}),  # exact thirds
        (10, STATIC_WEIGHTS, {"rag": 4, "tool": 3, "llm": 3}),  # one left over: first tie wins
        (0, STATIC_WEIGHTS, {"rag": 0, "tool": 0, "llm": 0}),  # nothing to split
        # 4/7*7 = 4, 0, 3/7*7 = 3 (floating 3.9999 still lands on 4 by its remainder)
        (7, weights(AgentSignals(1.0, 1.0, 1.0)), {"rag": 4, "tool": 0, "llm": 3}),
    ],
)
def test_allocate(total, w, expected) -> None:
    assert allocate(total, w) == expected


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"stability": -0.1, "rag_score": 0.5, "tool_conf": 0.5}, "stability"),  # below 0
        ({"stability": 0.5, "rag_score": 1.5, "tool_conf": 0.5}, "rag_score"),  # above 1
        ({"stability": 0.5, "rag_score": 0.5, "tool_conf": float("nan")}, "tool_conf"),  # NaN
    ],
)
def test_signals_are_validated(kwargs, name) -> None:
    with pytest.raises(ParameterError, match=name):
        AgentSignals(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"llm_base": 0.0}, "llm_base"), ({"rag_coef": -1.0}, "rag_coef"), ({"tool_coef": float("inf")}, "tool_coef")],
)
def test_params_are_validated(kwargs, name) -> None:
    with pytest.raises(ParameterError, match=name):
        AgentWeightParams(**kwargs)


def test_allocate_rejects_negative_total() -> None:
    with pytest.raises(ParameterError, match="total"):
        allocate(-1, STATIC_WEIGHTS)


@given(unit, unit, unit)
def test_weights_are_a_distribution(s, r, t) -> None:
    w = weights(AgentSignals(s, r, t))
    assert all(0.0 <= v <= 1.0 for v in (w.rag, w.tool, w.llm))
    assert w.rag + w.tool + w.llm == pytest.approx(1.0)
    assert w.llm > 0.0  # llm_base keeps the model in every turn


@given(unit, unit, unit, st.integers(0, 1000))
def test_allocation_sums_and_stays_within_one_slot(s, r, t, total) -> None:
    w = weights(AgentSignals(s, r, t))
    slots = allocate(total, w)
    assert sum(slots.values()) == total
    for kind, share in w.as_dict().items():
        assert abs(slots[kind] - total * share) < 1.0 + 1e-9


@given(unit, unit, unit)
def test_more_stability_never_lowers_the_raw_llm_weight(s, r, t) -> None:
    lo, hi = sorted((s, min(1.0, s + 0.1)))
    assert weights(AgentSignals(hi, r, t)).raw_llm >= weights(AgentSignals(lo, r, t)).raw_llm


def test_weights_round_trip() -> None:
    w = weights(AgentSignals(0.4, 0.6, 0.7))
    assert AgentWeights(**w.to_dict()) == w
