"""HLC send/receive rules, causality and monotonicity; RTT base/factor; NTP offset filter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers.errors import ParameterError
from controllers.hlc import ClockOffsetEstimator, Hlc, RttEstimator

pytestmark = pytest.mark.timeout(60)

# (state, remote, physical) -> expected, one comment each (the four receive branches)
RECEIVE = [
    ((5, 2), (5, 7), 4, (5, 8)),  # l equal on both, physical behind: max(c) + 1
    ((9, 2), (5, 7), 4, (9, 3)),  # local l largest: c + 1
    ((5, 2), (9, 7), 4, (9, 8)),  # remote l largest: remote c + 1
    ((5, 2), (6, 7), 10, (10, 0)),  # physical clock ahead of both: reset the counter
]


@pytest.mark.parametrize("state,remote,pt,want", RECEIVE)
def test_receive_rules(state: tuple[int, int], remote: tuple[int, int], pt: int, want: tuple[int, int]) -> None:
    assert Hlc(*state).receive(Hlc(*remote), pt) == Hlc(*want)


EVENTS = st.lists(
    st.tuples(st.sampled_from(["tick", "recv"]), st.integers(0, 2), st.integers(-50, 50)), min_size=1, max_size=60
)


@settings(max_examples=300, deadline=None)
@given(EVENTS, st.lists(st.integers(-30, 30), min_size=3, max_size=3))
def test_monotonic_causal_and_bounded(events: list, skews: list[int]) -> None:
    """Three nodes with skewed physical clocks exchange messages in random order."""
    clocks = [Hlc() for _ in range(3)]
    outbox: list[Hlc] = []
    now = 1000
    for kind, node, dt in events:
        now += abs(dt)
        pt = now + skews[node]
        before = clocks[node]
        if kind == "recv" and outbox:
            m = outbox.pop(0)
            clocks[node] = before.receive(m, pt)
            assert clocks[node] > m  # causality: a receive is after the send
        else:
            clocks[node] = before.tick(pt)
            outbox.append(clocks[node])
        assert clocks[node] > before  # strictly monotonic per node
        assert clocks[node].l >= pt  # never behind its own physical clock
        assert clocks[node].l - pt <= max(skews) - min(skews)  # bounded by the skew
        assert Hlc.decode(clocks[node].encode()) == clocks[node]


def test_encoding_preserves_order_and_total_order_breaks_ties() -> None:
    ts = [Hlc(10, 0), Hlc(10, 3), Hlc(11, 0), Hlc(11, 65535)]
    assert sorted(t.encode() for t in ts) == [t.encode() for t in ts]
    assert Hlc(10, 1).total_order_key("az-a") < Hlc(10, 1).total_order_key("az-b")
    with pytest.raises(ParameterError):
        Hlc(1, 1 << 16)


def test_rtt_base_is_the_mean_of_the_last_five_probes() -> None:
    est = RttEstimator()
    probes = [100.0, 10.0, 12.0, 14.0, 16.0, 18.0]
    for p in probes:
        est = est.probe("az-b", p)
    assert est.base_ms("az-b") == pytest.approx(np.mean(probes[-5:]))
    assert est.base_ms("az-x") == 0.0 and est.factor("az-x") == 1.0
    assert RttEstimator.from_dict(est.to_dict()) == est


def test_configured_factor_is_not_learned() -> None:
    est = RttEstimator(factors={"az-b": 1.35}).probe("az-b", 18.7)
    est = est.observe_delay("az-b", 100.0)
    assert est.factor("az-b") == 1.35
    assert est.compensation_ms("az-b") == pytest.approx(18.7 * 1.35)
    assert est.dispatch_at_ms("az-b", 1000.0) == pytest.approx(1000.0 + 18.7 * 1.35)


def test_learned_factor_converges_to_the_delay_ratio_plus_headroom() -> None:
    rng = np.random.default_rng(3)
    est = RttEstimator(z=0.0)
    for _ in range(5):
        est = est.probe("az-c", 9.3)
    for d in 9.3 * 1.12 * (1 + 0.02 * rng.standard_normal(400)):
        est = est.observe_delay("az-c", float(d))
    assert est.factor("az-c") == pytest.approx(1.12, abs=0.01)
    assert RttEstimator(z=2.0, learned=est.learned, probes=est.probes).factor("az-c") > est.factor("az-c")


def test_offset_estimator_recovers_an_injected_offset() -> None:
    """Server clock 37.5 ms ahead; one-way delays 5 ms + exponential queueing, asymmetric."""
    rng = np.random.default_rng(11)
    offset, est = 37.5, ClockOffsetEstimator(window=8)
    t = 0.0
    for _ in range(50):
        fwd, back = 5.0 + rng.exponential(4.0), 5.0 + rng.exponential(4.0)
        t0 = t
        t1 = t0 + fwd + offset
        t2 = t1 + 0.2
        t3 = t2 - offset + back
        est = est.sample(t0, t1, t2, t3)
        t += 1000.0
    assert est.offset_ms() == pytest.approx(offset, abs=est.error_bound_ms())
    assert abs(est.offset_ms() - offset) < 2.0 and est.delay_ms() < 16.0
    assert ClockOffsetEstimator.from_dict(est.to_dict()) == est
    with pytest.raises(ParameterError, match="negative delay"):
        est.sample(0.0, 10.0, 11.0, 0.5)
