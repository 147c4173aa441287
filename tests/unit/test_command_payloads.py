"""Command payloads and targets: one payload type and one target type per kind,
a table of valid and invalid payloads per kind with the field each error names."""

from __future__ import annotations

from typing import Any

import pytest

from loop.command_payloads import (
    AgentsPayload,
    BreakerPayload,
    CanaryPayload,
    RelocatePayload,
    RoutePayload,
    ScalePayload,
)
from loop.commands import (
    COMMAND_KINDS,
    PAYLOAD_TYPES,
    TARGET_TYPES,
    Command,
    CommandError,
)

# One valid (model, payload) per kind, as the drivers build them.
VALID: dict[str, tuple[str, dict[str, Any]]] = {
    "route": (
        "llama2-70b",
        {
            "weights": {"trading": {"llama2-70b|az-a": 0.75, "llama2-13b|az-a": 0.25}, "*": {"llama2-70b|az-b": 1.0}},
            "fallback": {"batch": "primary over SLO"},
        },
    ),
    "breaker": (
        "m|az-b",
        {"target": "m|az-b", "state": "half_open", "probe_budget": 20, "threshold": 0.005, "error_ratio": 0.02},
    ),
    "canary": ("m", {"model": "m", "version": "v2", "share": 0.05}),
    "relocate": ("m", {"node": "az-a/m/r1", "max_bytes": 2**30, "expected_generation": 3, "action": "compact"}),
    "agents": (
        "m",
        {
            "weights": {"rag": 0.5, "tool": 0.2, "llm": 0.3},
            "signals": {"stability": 0.9, "rag_score": 0.8, "tool_conf": 0.1},
            "paths": {"rag": 0.6, "llm": 0.4},
        },
    ),
}


def make_cmd(**kw: Any) -> Command:
    """A valid command (a scale to 4 replicas), fields overridden by ``kw``."""
    base: dict[str, Any] = dict(
        kind="scale",
        zone="az-a",
        model="m",
        target_replicas=4,
        reason="t",
        issued_at_ms=1_000,
        expires_at_ms=61_000,
        basis_ms=900,
    )
    base.update(kw)
    return Command(**base)


def cmd_of(kind: str, **kw: Any) -> Command:
    """A valid command of ``kind`` (scale: 4 replicas), fields overridden by ``kw``."""
    if kind == "scale":
        return make_cmd(**kw)
    model, payload = VALID[kind]
    return make_cmd(**{"kind": kind, "model": model, "target_replicas": None, "payload": payload, **kw})


# -- payloads: a table of valid and invalid ones per kind, the field named ---------------------------------------
def test_every_kind_has_a_payload_type_and_a_target_type() -> None:
    assert set(PAYLOAD_TYPES) == set(TARGET_TYPES) == COMMAND_KINDS
    assert all(p.KIND == k for k, p in PAYLOAD_TYPES.items())


@pytest.mark.parametrize("kind", sorted(VALID))
def test_valid_payloads_round_trip_through_their_type(kind: str) -> None:
    payload = VALID[kind][1]
    typed = PAYLOAD_TYPES[kind].from_dict(payload)
    assert typed.to_dict() == payload
    assert cmd_of(kind).typed_payload == typed


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        ("scale", {"target_replicas": 4}),
        ("scale", {"target_replicas": 0, "previous_replicas": 3}),
        ("route", {"weights": {"*": {"m|a": 0}}}),  # zero weight, no fallback
        ("route", {"weights": {"c": {"m|a": 2}}, "fallback": {}}),
        ("breaker", {"target": "m|z", "state": "closed", "probe_budget": 0, "threshold": 0, "error_ratio": 0}),
        ("breaker", {"target": "m|z", "state": "open", "probe_budget": 0, "threshold": 1.5, "error_ratio": 1.0}),
        ("canary", {"model": "m", "version": "v", "share": 0}),
        ("canary", {"model": "m", "version": "v", "share": 1}),
        ("relocate", {"node": "n", "max_bytes": 0, "expected_generation": 0, "action": "move"}),
        ("agents", {"weights": {"rag": 0, "tool": 0, "llm": 1}, "signals": VALID["agents"][1]["signals"], "paths": {}}),
    ],
)
def test_edge_valid_payloads(kind: str, payload: dict[str, Any]) -> None:
    assert PAYLOAD_TYPES[kind].from_dict(payload).to_dict() == payload


def _with(kind: str, **kw: Any) -> dict[str, Any]:
    return {**VALID[kind][1], **kw}


def _without(kind: str, key: str) -> dict[str, Any]:
    return {k: v for k, v in VALID[kind][1].items() if k != key}


INVALID: list[tuple[str, Any, str]] = [
    # (kind, payload, the field the error names)
    ("route", _without("route", "weights"), "'weights'"),
    ("route", _with("route", weights={}), "'weights'"),
    ("route", _with("route", weights=[1]), "'weights'"),
    ("route", _with("route", weights={"c": [0.5]}), "'weights.c'"),
    ("route", _with("route", weights={"c": {"m|a": -1}}), r"'weights\.c\.m\|a'"),
    ("route", _with("route", weights={"c": {"m|a": True}}), r"'weights\.c\.m\|a'"),
    ("route", _with("route", weights={"c": {"m|a": "0.5"}}), r"'weights\.c\.m\|a'"),
    ("route", _with("route", weights={"c": {"m": 1.0}}), "'weights.c.<target>'"),
    ("route", _with("route", weights={"c": {"m|": 1.0}}), "'weights.c.<target>'"),
    ("route", _with("route", weights={"": {"m|a": 1.0}}), "'weights.<class>'"),
    ("route", _with("route", fallback=["c"]), "'fallback'"),
    ("route", _with("route", fallback={"c": 3}), "'fallback.c'"),
    ("route", _with("route", extra=1), "'extra'"),
    ("breaker", _without("breaker", "target"), "'target'"),
    ("breaker", _with("breaker", target="m"), "'target'"),
    ("breaker", _with("breaker", target="|az-b"), "'target'"),
    ("breaker", _with("breaker", state="tripped"), "'state'"),
    ("breaker", _with("breaker", state=None), "'state'"),
    ("breaker", _without("breaker", "probe_budget"), "'probe_budget'"),
    ("breaker", _with("breaker", probe_budget=-1), "'probe_budget'"),
    ("breaker", _with("breaker", probe_budget=2.5), "'probe_budget'"),
    ("breaker", _with("breaker", threshold=-0.1), "'threshold'"),
    ("breaker", _with("breaker", threshold="high"), "'threshold'"),
    ("breaker", _with("breaker", error_ratio=1.5), "'error_ratio'"),
    ("breaker", _without("breaker", "error_ratio"), "'error_ratio'"),
    ("breaker", _with("breaker", version=2), "'version'"),
    ("canary", _without("canary", "model"), "'model'"),
    ("canary", _with("canary", model=""), "'model'"),
    ("canary", _with("canary", version=2), "'version'"),
    ("canary", _with("canary", share=1.01), "'share'"),
    ("canary", _with("canary", share=-0.01), "'share'"),
    ("canary", _with("canary", share=False), "'share'"),
    ("canary", _without("canary", "share"), "'share'"),
    ("relocate", _with("relocate", node=""), "'node'"),
    ("relocate", _with("relocate", node=7), "'node'"),
    ("relocate", _with("relocate", action="evict"), "'action'"),
    ("relocate", _with("relocate", max_bytes=-1), "'max_bytes'"),
    ("relocate", _with("relocate", max_bytes=1.0), "'max_bytes'"),
    ("relocate", _with("relocate", expected_generation=True), "'expected_generation'"),
    ("relocate", _without("relocate", "expected_generation"), "'expected_generation'"),
    ("agents", _with("agents", weights={"rag": 0.5, "tool": 0.5}), "'weights'"),
    ("agents", _with("agents", weights={"rag": 0.5, "tool": 0.2, "llm": 0.3, "search": 0.0}), "'weights'"),
    ("agents", _with("agents", weights={"rag": -0.1, "tool": 0.8, "llm": 0.3}), "'weights.rag'"),
    ("agents", _with("agents", signals={"stability": 0.9, "rag_score": 0.8, "tool_conf": 1.5}), "'signals.tool_conf'"),
    ("agents", _without("agents", "paths"), "'paths'"),
    ("agents", _with("agents", paths={"rag": "most"}), "'paths.rag'"),
    ("agents", _with("agents", paths=[]), "'paths'"),
    ("agents", {}, "'weights'"),
]


@pytest.mark.parametrize(("kind", "payload", "field"), INVALID)
def test_invalid_payloads_name_the_field(kind: str, payload: Any, field: str) -> None:
    with pytest.raises(CommandError, match=f"{kind} payload field {field}"):
        PAYLOAD_TYPES[kind].from_dict(payload)
    model = VALID[kind][0]
    with pytest.raises(CommandError, match=f"{kind} payload field {field}"):
        make_cmd(kind=kind, model=model, target_replicas=None, payload=payload)


@pytest.mark.parametrize("kind", sorted(VALID))
def test_a_payload_that_is_not_an_object_is_refused(kind: str) -> None:
    with pytest.raises(CommandError, match=f"{kind} payload must be a JSON object"):
        PAYLOAD_TYPES[kind].from_dict([1, 2])


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"target_replicas": -1}, "'target_replicas'"),
        ({"target_replicas": 2.0}, "'target_replicas'"),
        ({"target_replicas": True}, "'target_replicas'"),
        ({"target_replicas": None}, "'target_replicas'"),
        ({"previous_replicas": -3}, "'previous_replicas'"),
        ({"previous_replicas": "2"}, "'previous_replicas'"),
    ],
)
def test_scale_checks_its_replicas(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(CommandError, match=f"scale payload field {field}"):
        make_cmd(**kw)


def test_scale_payload_is_the_top_level_target_and_keeps_an_empty_payload() -> None:
    c = make_cmd(target_replicas=7, previous_replicas=5)
    assert c.typed_payload == ScalePayload(7, 5) and c.payload == {}
    assert c.payload_as(ScalePayload).target_replicas == 7
    with pytest.raises(CommandError, match="payload must be empty for scale"):
        make_cmd(payload={"target_replicas": 7})
    with pytest.raises(CommandError, match="no RoutePayload"):
        c.payload_as(RoutePayload)


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("route", RoutePayload),
        ("breaker", BreakerPayload),
        ("canary", CanaryPayload),
        ("relocate", RelocatePayload),
        ("agents", AgentsPayload),
    ],
)
def test_typed_payload_is_the_kinds_type(kind: str, cls: type) -> None:
    c = cmd_of(kind)
    assert isinstance(c.typed_payload, cls) and c.payload_as(cls) is c.typed_payload


@pytest.mark.parametrize("kind", sorted(VALID))
def test_only_scale_carries_target_replicas(kind: str) -> None:
    assert cmd_of(kind).target_replicas is None and cmd_of(kind).previous_replicas is None
    with pytest.raises(CommandError, match=f"target_replicas must be None for {kind}"):
        cmd_of(kind, target_replicas=0)
    with pytest.raises(CommandError, match=f"previous_replicas must be None for {kind}"):
        cmd_of(kind, previous_replicas=2)


# -- targets --------------------------------------------------------------------------------------------------------
def test_the_target_type_per_kind() -> None:
    assert TARGET_TYPES == {
        "scale": "model",
        "route": "family",
        "breaker": "model|zone",
        "canary": "model",
        "relocate": "model",
        "agents": "model",
    }
    for kind in COMMAND_KINDS:
        c = cmd_of(kind)
        assert c.target == c.model and c.target_type == TARGET_TYPES[kind]
    assert cmd_of("breaker").target == cmd_of("breaker").payload["target"] == "m|az-b"


@pytest.mark.parametrize("bad", ["m", "m|", "|az-a", "m|az-a|x", ""])
def test_a_breaker_target_is_model_bar_zone(bad: str) -> None:
    with pytest.raises(CommandError, match=r"'model\|zone'"):
        cmd_of("breaker", model=bad, payload=_with("breaker", target=bad))


@pytest.mark.parametrize("kind", ["scale", "route", "canary", "relocate", "agents"])
@pytest.mark.parametrize("bad", ["m|az-a", "", 7])
def test_a_model_or_family_target_has_no_bar(kind: str, bad: Any) -> None:
    with pytest.raises(CommandError, match="model \\(the target\\)"):
        cmd_of(kind, model=bad)


def test_the_payload_names_the_same_target_as_the_command() -> None:
    with pytest.raises(CommandError, match="breaker payload field 'target'.*differs"):
        cmd_of("breaker", model="m|az-a")  # payload says m|az-b
    with pytest.raises(CommandError, match="canary payload field 'model'.*differs"):
        cmd_of("canary", model="other")
