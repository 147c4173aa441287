"""The shipped deployments run no more stream workers than there are partitions to divide.

Workers beyond ``GOVERNOR_PARTITIONS`` get no partition and idle (streams/ownership.py);
infra/k8s/worker.yaml and docker-compose.yml say so in their comments.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_k8s_worker_replicas_fit_the_partitions() -> None:
    worker = yaml.safe_load((ROOT / "infra/k8s/worker.yaml").read_text())
    env = yaml.safe_load((ROOT / "infra/k8s/configmap.yaml").read_text())["data"]
    replicas, partitions = worker["spec"]["replicas"], int(env["GOVERNOR_PARTITIONS"])
    assert 1 <= replicas <= partitions, (replicas, partitions)
    assert "GOVERNOR_PARTITIONS" in (ROOT / "infra/k8s/worker.yaml").read_text()  # the comment says why


def test_the_compose_workers_fit_the_partitions() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    workers = [s for s in compose["services"].values() if s.get("command") == ["governor", "worker"]]
    partitions = {int(s["environment"]["GOVERNOR_PARTITIONS"]) for s in workers}
    assert workers and len(partitions) == 1
    assert len(workers) * workers[0].get("deploy", {}).get("replicas", 1) <= partitions.pop()
