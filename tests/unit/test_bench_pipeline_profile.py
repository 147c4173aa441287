"""``governor bench pipeline``'s profile summary: where a worker's busy time goes, by step."""

from __future__ import annotations

import cProfile
import time
from pathlib import Path

import pytest

from bench.pipeline import MODEL, backlog, profile_top
from core.settings import ModelSpec, Settings
from loop.pipeline import TelemetryProcessor

pytestmark = pytest.mark.timeout(60)


def test_the_profile_splits_the_processor_into_its_steps(tmp_path: Path) -> None:
    # A real profile of the processor over columnar messages, one row of each a suspect (a dead letter).
    zones = ["az-a", "az-b"]
    msgs = backlog(2_000, 100, zones, int(time.time() * 1000), "columns")
    proc = TelemetryProcessor(Settings(models=(ModelSpec(MODEL),), zones=tuple(zones), lateness_s=60.0))
    bad = msgs[0][1].replace(b'"ok"', b'"weird"', 1)  # one row's status is no status
    path = tmp_path / "p.pstats"
    prof = cProfile.Profile()
    prof.enable()
    dead = [proc.process(v, {"topic": "t", "offset": i}, int(time.time() * 1000)) for i, (_, v) in enumerate(msgs)]
    dead.append(proc.process(bad, {"topic": "t", "offset": -1}, int(time.time() * 1000)))
    prof.disable()
    prof.dump_stats(path)
    assert sum(len(r.dead_letters) for r in dead) == 1
    layers = profile_top(path)["layers"]
    assert 0.5 < layers["processor"] <= 1.05  # cProfile's own bookkeeping may round past the busy sum
    steps = layers["decode"] + layers["column checks"] + layers["windowing"] + layers["per-record path"]
    assert 0 < layers["per-record path"] and 0.5 * layers["processor"] < steps <= layers["processor"] + 0.001
    assert layers["ingest agent"] == 0 and layers["faust, aiokafka, asyncio"] == 1.0  # no worker here
