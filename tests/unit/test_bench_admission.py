"""``governor bench admission``'s core (:func:`bench.admission.measure`) on small registries."""

from __future__ import annotations

import pytest

from bench.admission import measure

pytestmark = pytest.mark.timeout(120)


def test_every_task_is_admitted_and_the_rows_say_what_was_run() -> None:
    # At utilisation 0.6 with rate-monotonic priorities every set is feasible (Liu-Layland bound ~0.69).
    rows = measure((20, 130), seed=3)
    assert [(r["tasks"], r["orchestrators"], r["admitted"]) for r in rows] == [(20, 1, 20), (130, 2, 130)]
    for r in rows:
        assert r["one_set_feasible"] and r["one_set_margin"] >= 1
        assert min(r["first_review_s"], r["recheck_s"], r["analyse_one_set_s"]) >= 0
