"""The router policy from GOVERNOR_LOCAL_ROUTER_POLICY (engines/router.py) and the load client's shared
prefixes (engines/loadgen.py)."""

from __future__ import annotations

import pytest

from core.settings import Settings
from engines.loadgen import RequestSpec, _prompt
from engines.router import policy_args


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("round_robin", ("--policy", "round_robin")),
        ("cache_aware", ("--policy", "cache_aware")),
        (
            "cache_aware, cache_threshold=0.3,balance_abs_threshold=4,balance_rel_threshold=1.5",
            ("--policy", "cache_aware", "--cache-threshold", "0.3", "--balance-abs-threshold", "4",
             "--balance-rel-threshold", "1.5"),
        ),
    ],
)  # fmt: skip
def test_policy_args(spec: str, want: tuple[str, ...]) -> None:
    assert policy_args(spec) == want


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("random", "policy 'random'"),  # not one governor starts
        ("round_robin,cache_threshold=0.3", "no thresholds"),
        ("cache_aware,cache_threshold=1.5", "cache_threshold=1.5 must be"),
        ("cache_aware,balance_abs_threshold=2.5", "balance_abs_threshold='2.5' is not a int"),
        ("cache_aware,balance_rel_threshold=0.9", "balance_rel_threshold=0.9 must be >= 1.0"),
        ("cache_aware,eviction=5", "'eviction=5' is not one of"),
    ],
)
def test_bad_policies_name_what_is_wrong(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match="GOVERNOR_LOCAL_ROUTER_POLICY") as err:
        policy_args(spec)
    assert match in str(err.value)


def test_the_default_policy_is_round_robin() -> None:
    assert policy_args(Settings().local_router_policy) == ("--policy", "round_robin")


def test_requests_of_a_group_share_their_prefix_and_no_more() -> None:
    a, b = (_prompt(i, RequestSpec(0.0, 40, 4, prefix=7, prefix_tokens=32)) for i in (0, 1))
    other = _prompt(0, RequestSpec(0.0, 40, 4, prefix=8, prefix_tokens=32))
    assert len(a) == len(b) == 40 and a[:32] == b[:32] and a[32:] != b[32:]
    assert other[:32] != a[:32] and all(3 <= t < 259 for t in a + other)
    assert _prompt(5, RequestSpec(0.0, 40, 4)) == _prompt(5, RequestSpec(0.0, 40, 4, prefix_tokens=32))
