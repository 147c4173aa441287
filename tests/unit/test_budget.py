"""Per-zone allowances of the fleet budget (core/budget.py), ``governor budget``'s checks, and the executor ACL
that the allowances make possible: no script, no key of another zone, the pause key and the allowance read only."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core import names
from core.budget import Allowance, BudgetError, default_allowances, split, within_budget
from core.settings import ModelSpec, Secret, Settings
from governor.budget_cli import run_budget
from governor.redis_acl import RedisAclError, executor_user, parse_version, worker_user

ZONES = ("az-a", "az-b", "az-c")


@pytest.mark.parametrize(
    ("total", "zones", "weights", "expected"),
    [
        (100, ZONES, None, {"az-a": 34, "az-b": 33, "az-c": 33}),  # the remainder to the earliest zones
        (100, ("az-a", "az-b"), None, {"az-a": 50, "az-b": 50}),
        (10, ("az-a", "az-b"), {"az-a": 3, "az-b": 1}, {"az-a": 8, "az-b": 2}),  # 7.5 / 2.5: tie to the first
        (0, ("az-a", "az-b"), None, {"az-a": 0, "az-b": 0}),
        (5, ("az-a", "az-b"), {"az-a": 1, "az-b": 0}, {"az-a": 5, "az-b": 0}),  # a zone may get nothing
    ],
)
def test_split(total: int, zones: tuple[str, ...], weights: dict[str, float] | None, expected: dict[str, int]) -> None:
    assert split(total, zones, weights) == expected


@pytest.mark.parametrize(
    ("total", "weights", "match"),
    [
        (-1, None, "total"),
        (True, None, "total"),
        (10, {"az-a": 1}, "weights"),  # a zone missing
        (10, {"az-a": 0, "az-b": 0}, "weights"),  # nothing to split by
        (10, {"az-a": float("nan"), "az-b": 1}, "weights"),
        (10, {"az-a": -1, "az-b": 1}, "weights"),
    ],
)
def test_split_refuses(total: int, weights: dict[str, float] | None, match: str) -> None:
    with pytest.raises(BudgetError, match=match):
        split(total, ("az-a", "az-b"), weights)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(
    st.integers(0, 10**6),
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=8).filter(lambda w: sum(w) > 0),
)
@example(100, [1.0, 1.0, 1.0])
@example(7, [1e-300, 1e6])
def test_a_split_never_gives_more_than_the_total(total: int, ws: list[float]) -> None:
    zones = [f"z{i}" for i in range(len(ws))]
    out = split(total, zones, dict(zip(zones, ws, strict=True)))
    assert sum(out.values()) == total and all(n >= 0 for n in out.values())


@pytest.mark.parametrize(
    "raw",
    [
        None,
        b"",
        b"junk",
        b"[]",
        b'{"total": "lots"}',
        b'{"total": -1}',
        b'{"total": 1.5}',
        b'{"total": true}',
        b'{"total": 10, "models": {"m": -3}}',
        b'{"total": 10, "by": "az-a"}',  # only the worker or an operator write allowances
        b'{"total": 4294967296}',
    ],
)
def test_a_malformed_allowance_is_none(raw: bytes | None) -> None:
    assert Allowance.decode(raw) is None  # the executor then holds scale-ups


def test_default_allowances_fit_and_operators_that_do_not_are_found() -> None:
    out = default_allowances(ZONES, 100, {"m": 10})
    assert [a.total for a in out.values()] == [34, 33, 33] and [a.models["m"] for a in out.values()] == [4, 3, 3]
    assert within_budget(out, 100, {"m": 10}) is None
    assert "sum above GOVERNOR_MAX_REPLICAS_TOTAL=99" in str(within_budget(out, 99, {"m": 10}))
    assert "m's zone shares" in str(within_budget(out, 100, {"m": 9}))
    assert "zone totals" in str(within_budget(default_allowances(ZONES, None, {"m": 10}), 100, {}))


def _budget(s: Settings, command: str, *shares: str, weights: str = "", model: str = "") -> int:
    return run_budget(s, argparse.Namespace(budget=command, shares=list(shares), weights=weights, model=model))


def test_governor_budget_set_refuses_a_split_above_the_budget_before_any_redis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = Settings(
        redis_url=Secret("redis://127.0.0.1:1/0"),  # nothing listens: every refusal below comes first
        zones=("az-a", "az-b"),
        max_replicas_total=100,
        models=(ModelSpec("m", max_replicas_total=20),),
    )
    cases = [
        (("az-a=70", "az-b=40"), {}, "sum above GOVERNOR_MAX_REPLICAS_TOTAL=100"),
        (("az-a=70",), {}, "each of GOVERNOR_ZONES"),
        (("az-a=70", "az-b=1.5"), {}, "whole number"),
        (("az-a=lots", "az-b=1"), {}, "not ZONE=NUMBER"),
        (("az-a=15", "az-b=15"), {"model": "m"}, "m's zone shares"),
        ((), {"model": "x"}, "'x' has no max_replicas_total"),
        ((), {}, "give ZONE=N"),
    ]
    for shares, kw, why in cases:
        assert _budget(s, "set", *shares, **kw) == 2
        err = capsys.readouterr().err
        assert err.startswith("governor budget: ") and why in err, (shares, err)
    assert _budget(Settings(redis_url=Secret("redis://127.0.0.1:1/0")), "reset") == 2
    assert "no fleet budget" in capsys.readouterr().err


def test_the_executor_acl_has_no_script_no_other_zone_and_reads_the_pause_key_and_its_allowance_only() -> None:
    u = executor_user("p", "az-a", ZONES)
    assert not {"eval", "evalsha", "script", "fcall", "function", "del"} & {c.split("|")[0] for c in u.commands}
    assert not any("az-b" in k or "az-c" in k for k in (*u.keys, *u.read_keys))
    assert set(u.read_keys) == {names.paused("p"), names.zone_allowance("p", "az-a")}
    assert names.desired_replicas("p", "az-a") in u.keys  # its own ledger, written by it alone
    rules = u.rules("0" * 64)
    assert "%R~p:paused" in rules and "~p:paused" not in rules and "%R~p:budget:az-a:allowance" in rules
    assert {names.zone_allowance("p", z) for z in ZONES} <= set(worker_user("p", ZONES).keys)
    for too_old in ("6.2", "6.0", "5.0"):
        with pytest.raises(RedisAclError, match="needs Redis 7.0 or later"):
            parse_version(too_old)
    assert parse_version("7.2.4") == (7, 2)
