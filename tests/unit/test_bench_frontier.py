"""``governor bench frontier``: each strategy's knob swept, the oracle as the limit, the summary per scenario."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.frontier import KNOBS, run_frontier
from governor.cli import build_parser

pytestmark = pytest.mark.timeout(120)


def test_frontier_json_names_every_point_and_each_scenarios_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "frontier", "--scenario", "step", "--qps", "2", "--duration-s", "120"]
    argv += ["--strategies", "governor,static,kpa,oracle,oracle-causal", "--json", "--out", str(tmp_path)]
    argv += ["--markdown", str(tmp_path / "t.md")]
    assert run_frontier(build_parser().parse_args(argv)) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (sc,) = out["scenarios"]
    assert sc["scenario"] == "step" and 0 < sc["ceiling"] <= 1 and sc["lower_bound_gpu_seconds"] > 0
    points = sc["points"]
    assert len(points) == 11 + 3 * 5 + 6  # governor: eleven headroom values; kpa: six multiples of its derived target
    for p in points:
        assert {"strategy", "scenario", "knob", "knob_value", "slo_attainment", "gpu_seconds"} <= set(p)
        assert p["knob"] == KNOBS[p["strategy"]][0] and p["scenario"] == "step"
        assert p["gpu_seconds"] >= sc["lower_bound_gpu_seconds"]
    static = sorted((p for p in points if p["strategy"] == "static"), key=lambda p: p["knob_value"])
    assert [p["gpu_seconds"] for p in static] == sorted(p["gpu_seconds"] for p in static)  # more replicas, more GPU-s
    # the summary is computed from the points: governor's cheapest point at 99.5 % of the ceiling
    goal = 0.995 * sc["ceiling"]
    gov = [p["gpu_seconds"] for p in points if p["strategy"] == "governor" and p["slo_attainment"] >= goal]
    assert sc["governor_gpu_seconds_at_target"] == (min(gov) if gov else None)
    causal = [p["gpu_seconds"] for p in points if p["strategy"] == "oracle-causal" and p["slo_attainment"] >= goal]
    assert sc["causal_oracle_gpu_seconds_at_target"] == (min(causal) if causal else None)
    if gov and causal:
        assert sc["governor_over_causal_oracle"] == round(min(gov) / min(causal), 3)
    # static (clairvoyant) and the oracles are references: dominance is counted over the peers (kpa here)
    kpa = [p for p in points if p["strategy"] == "kpa"]
    assert sc["peer_points"] == len(kpa) == 6 and sc["derived_targets"]["kpa"]["value"] > 0
    assert sorted(sc["dominated_by_governor"] + sc["not_dominated"]) == sorted(f"kpa@{p['knob_value']:g}" for p in kpa)
    ok = [p["gpu_seconds"] for p in static if p["slo_attainment"] >= goal]
    assert sc["static_gpu_seconds_at_target"] == (min(ok) if ok else None)
    assert Path(sc["plot"]).exists()
    table = (tmp_path / "t.md").read_text().splitlines()
    assert table[0].startswith("`governor bench frontier --trace azure-conv --qps 2 --duration-s 120")
    (row,) = [line for line in table if line.startswith("| step |")]
    assert f"{len(sc['dominated_by_governor'])} of 6 (" in row
