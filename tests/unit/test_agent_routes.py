"""Agent class weights as routes: pool shares (controllers/agent_weights.py) and the gateway backend's
``x-agent-class`` rules (executors/gateway.py, pure part)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controllers.agent_weights import pool_shares
from controllers.errors import ParameterError
from core.workloads import parse_routes
from executors.backends import BackendRejected
from executors.gateway import agent_rules

weights = st.fixed_dictionaries({k: st.floats(0.0, 10.0) for k in ("rag", "tool", "llm")})


@settings(derandomize=True, max_examples=200, deadline=None)
@given(weights, st.integers(1, 16))
@example({"rag": 1.0, "tool": 0.0, "llm": 0.0}, 1)
@example({"rag": 1e-9, "tool": 0.0, "llm": 1.0}, 16)
@example({"rag": 0.0, "tool": 0.0, "llm": 0.0}, 1)
@example({"rag": 5e-324, "tool": 0.0, "llm": 1.0}, 1)
def test_each_class_holds_its_weight_of_the_pools(w: dict[str, float], n: int) -> None:
    shares = pool_shares(w, n)
    total = sum(w.values())
    assert {k for k, v in w.items() if v > 1e-9 * total} <= set(shares) <= {k for k, v in w.items() if v > 0}
    for s in shares.values():
        assert len(s) == n and min(s) >= 0.0 and sum(s) == pytest.approx(1.0)
    for p in range(n if total > 0 else 0):  # arriving in proportion to the weights, the classes load every pool equally
        assert sum(w[k] / total * s[p] for k, s in shares.items()) == pytest.approx(1.0 / n, abs=1e-9)


@pytest.mark.parametrize(
    ("w", "n", "name"),
    [({"rag": -1.0}, 2, "weights"), ({"rag": float("nan")}, 2, "weights"), ({"rag": 1.0}, -1, "n_pools")],
)
def test_pool_shares_names_the_bad_parameter(w: dict[str, float], n: int, name: str) -> None:
    with pytest.raises(ParameterError, match=name):
        pool_shares(w, n)


ROUTE = parse_routes(
    [
        {
            "family": "m",
            "zone": "z",
            "route": "llm",
            "backends": {"m|z": {"name": "svc"}},
            "agent_pools": [{"name": "p0"}, {"name": "p1"}],
        }
    ]
)[0]


@pytest.mark.parametrize("cls", ["", " rag", "rag\n", "r\x00g", "x" * 4097, "é"])
def test_a_class_that_is_no_header_value_is_rejected(cls: str) -> None:
    with pytest.raises(BackendRejected, match="header value"):
        agent_rules(ROUTE, [{"backendRefs": [{"name": "svc"}]}], {cls: 1.0, "llm": 1.0})


def test_rules_are_rebuilt_not_added() -> None:
    rules, written = agent_rules(ROUTE, [{"backendRefs": [{"name": "svc"}]}], {"rag": 1.0, "tool": 0.0, "llm": 1.0})
    again, _ = agent_rules(ROUTE, rules, {"rag": 1.0, "tool": 0.0, "llm": 0.0})
    assert written == {"rag": {"p0": 1000, "p1": 0}, "llm": {"p0": 0, "p1": 1000}}
    assert (
        len(rules) == 3
        and len(again) == 2
        and again[1]["backendRefs"]
        == [
            {"name": "p0", "weight": 500},
            {"name": "p1", "weight": 500},
        ]
    )
    assert agent_rules(ROUTE, rules, {})[0] == rules[:1]  # no weights: governor's rules go, the default stays


def test_parse_routes_checks_agent_pools() -> None:
    base = {"family": "m", "zone": "z", "route": "llm", "backends": {"m|z": {"name": "svc"}}}
    with pytest.raises(ValueError, match=r"agent_pools\[0\]\.name"):
        parse_routes([{**base, "agent_pools": [{"port": 80}]}])
    with pytest.raises(ValueError, match="at most 16"):
        parse_routes([{**base, "agent_pools": [{"name": f"p{i}"} for i in range(17)]}])
    assert parse_routes([base])[0].agent_pools == ()


def test_unusable_weights_in_a_hand_edited_intent_drop_the_class_rules() -> None:
    rules, _ = agent_rules(ROUTE, [{"backendRefs": [{"name": "svc"}]}], {"rag": 1.0, "tool": 0.0, "llm": 1.0})
    assert agent_rules(ROUTE, rules, {"rag": "lots"}) == (rules[:1], {})  # type: ignore[dict-item]
