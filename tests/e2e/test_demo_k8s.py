"""The demo's closed loop on a Kubernetes API: ``governor demo --platform k8s``.

The simulated fleet plays the workload controller: it runs the replicas the
Deployments' ``spec.replicas`` says (tests/kube_api.py serves the real API paths)
and writes its ready and starting replicas through their ``status`` subresource;
the executors scale those Deployments with the ``k8s`` backend (child processes,
the official client) and report their status back as replica truth.  The load
step must be scaled through that path alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kube_api import KubeAPI

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama2-70b"
ZONES = ("az-a", "az-b")


def workloads() -> str:
    return json.dumps(
        [{"model": MODEL, "zone": z, "kind": "Deployment", "name": f"{MODEL}-{z}", "namespace": "llm"} for z in ZONES]
    )


def run_demo(api: KubeAPI, out: Path, *extra: str, timeout_s: float = 280) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "REDIS_URL")}
    env.update(GOVERNOR_K8S_API_URL=api.url, GOVERNOR_WORKLOADS=workloads())
    argv = [sys.executable, "-m", "governor.cli", "--log-level", "WARNING", "demo", "--platform", "k8s"]
    argv += ["--out", str(out), "--no-progress", "--bad-rate", "0", *extra]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


def seeded_api() -> KubeAPI:
    api = KubeAPI(auto_ready=False)  # the simulated fleet reports readiness, as a real controller would
    api.start()
    for z in ZONES:
        api.add_deployment(f"{MODEL}-{z}", namespace="llm", replicas=1)
    return api


def test_the_load_step_is_scaled_through_the_api_server(tmp_path: Path) -> None:
    api = seeded_api()
    try:
        proc = run_demo(
            api, tmp_path, "--speed", "10", "--duration-s", "100", "--step-at-s", "25", "--step-factor", "3"
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        report: dict[str, Any] = json.loads((tmp_path / "report.json").read_text())
        assert report["executor_backend"] == "k8s"
        # The executors wrote the scale subresource (merge patches), and the fleet followed spec.replicas.
        scale_writes = [r for r in api.requests if r[0] == "PATCH" and r[1].split("?")[0].endswith("/scale")]
        assert len(scale_writes) > len(ZONES), api.requests[-20:]  # the demo's initial size + governor's commands
        assert all(r[2] == "application/merge-patch+json" for r in scale_writes)
        deps = {z: api.get("apps/v1", "deployments", f"{MODEL}-{z}", "llm") for z in ZONES}
        assert any(d["spec"]["replicas"] > 4 for d in deps.values()), {z: d["spec"] for z, d in deps.items()}
        assert any(r["max"] > r["start"] for r in report["replicas"].values()), report["replicas"]
        # The fleet reported its replicas through the status subresource, and the workloads carry governor's why.
        assert any(r[0] == "PATCH" and r[1].split("?")[0].endswith("/status") for r in api.requests)
        assert all(d["status"].get("readyReplicas", 0) >= 1 for d in deps.values())
        notes = [d["metadata"].get("annotations", {}) for d in deps.values()]
        assert any("governor.io/command-id" in n for n in notes), notes
    finally:
        api.stop()


def test_no_workloads_is_a_clear_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "REDIS_URL", "GOVERNOR_WORKLOADS")}
    argv = [sys.executable, "-m", "governor.cli", "demo", "--platform", "k8s", "--out", str(tmp_path)]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "GOVERNOR_WORKLOADS" in proc.stderr, proc.stderr
