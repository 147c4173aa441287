"""``governor demo --platform local`` as a user runs it: real vLLM engines behind the real vLLM router.

One run (it shares nothing with the pool's tests: its own router, executor and engines), short:
the first engine, the profile, a load step that needs a second engine, and a tail that lets the
loop drain one away while requests are in flight.  It asserts what issue 33 asks of the demo:

* no request the client sent failed, timed out or was cut (a drained scale-down loses nothing);
* the engines' own telemetry, scraped by ``governor ingest scrape`` from the pool's HTTP SD
  document, counted exactly the requests the client finished (histogram counts are exact; the
  first engine's profile requests precede the adapter's first round, so they are its baseline);
* the loop scaled 1 -> 2 through the ``local`` backend, and any engine it stopped was drained first;
* no process of the pool outlives the executor.

Slow (two cold starts, minutes on a loaded machine): marked ``engines``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.engines, pytest.mark.timeout(1500)]


def test_the_closed_loop_governs_real_engines(tmp_path: Path, engine_python: Path, tiny_model: Path) -> None:
    out = tmp_path / "demo-local"
    argv = [
        sys.executable, "-m", "governor.cli", "demo", "--platform", "local", "--out", str(out),
        "--duration-s", "180", "--step-at-s", "30", "--tail-at-s", "130",
        "--profile-trial-s", "8", "--profile-steps", "3",
    ]  # fmt: skip
    env = {**os.environ, "GOVERNOR_ENGINE_PYTHON": str(engine_python), "GOVERNOR_LOG_LEVEL": "WARNING"}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "ORPHANS" not in proc.stderr, proc.stderr[-2000:]  # the executor stopped every engine it started
    report = json.loads((out / "report.json").read_text())
    assert report["platform"] == "local"
    client = report["client"]
    assert client["counts"]["ok"] == client["requests"] > 100, client["counts"]
    assert report["pipeline"]["requests_in_windows"] == client["counts"]["ok"], (report["pipeline"], client)
    ups = [a for a in report["scale_actions"] if a["outcome"] == "applied" and a["target"] == 2]
    assert ups and ups[0]["detail"]["started"], report["scale_actions"]  # the local backend started an engine
    # Every stop drained (a drained scale-down with requests in flight on real engines: test_local_engines.py;
    # the loop's own scale-down did not come within this short tail in the runs so far: the PID's integral).
    stops = [s for a in report["scale_actions"] for s in (a.get("detail") or {}).get("stopped", [])]
    assert all(s["drained"] for s in stops), stops
    for name in ("report.txt", "report.png", "requests.json", "windows.json"):
        assert (out / name).stat().st_size > 0, name
    assert "platform local" in (out / "report.txt").read_text()
