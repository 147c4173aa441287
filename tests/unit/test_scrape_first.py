"""The scrape adapter on the engines' real multiprocess pages: a new replica's first scrape,
and the misconfigurations it names (issue 34 items 1 and 3).

The pages (tests/fixtures/engines/*_mp_*.txt) are rendered by ``prometheus_client``'s
``MultiProcessCollector`` from the engines' own metric names, label names and bucket edges
(``multiprocess_pages.py`` says how); SGLang always serves this shape, vLLM does with
``--api-server-count`` > 1.  It has no ``process_start_time_seconds``.  Page 1: 20 requests;
page 2: 8 more (one aborted), every token 180 ms apart.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from governor_telemetry.records import validate_record

from adapters.scrape.runner import Endpoint, Scraper, parse_exposition
from adapters.scrape.targets import KubernetesTargets, parse_http_sd
from core.settings import ModelSpec, Settings

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
SETTINGS = Settings(models=(ModelSpec("tiny", ttft_slo_ms=1000.0, itl_slo_ms=150.0),), window_s=10.0)
ENGINES = ("sglang", "vllm")
OLD = Endpoint("http://10.0.0.4:8000/metrics", "az-a")
NEW = Endpoint("http://10.0.0.5:8000/metrics", "az-a")


def page(engine: str, i: int) -> str:
    return (FIX / f"{engine}_mp_{i}.txt").read_text()


def requests(recs: list[dict[str, Any]], node: str | None = None) -> list[dict[str, Any]]:
    return [r for r in recs if r["kind"] == "request" and (node is None or r["node"] == node)]


def _lines(text: str) -> list[str]:
    """The page's lines, pids masked, in order (families come in the db files' directory order)."""
    # A sample's value to 12 significant digits: multiprocess mode sums the processes' files in the directory's
    # order, which the filesystem chooses, so a sum can come out 4.199999999999999 where the fixture says 4.2.
    masked = re.sub(r'pid="\d+"', 'pid="P"', text)
    return sorted(re.sub(r"(?<= )(\d+\.\d+)$", lambda m: format(float(m.group(1)), ".12g"), line)
                  for line in masked.splitlines())  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
def test_fixtures_are_what_prometheus_multiprocess_mode_renders(engine: str, tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(FIX / "multiprocess_pages.py"), engine, str(tmp_path / engine)], check=True)
    for i in (1, 2):
        fresh = (tmp_path / f"{engine}_{i}.txt").read_text()
        assert _lines(fresh) == _lines(page(engine, i))
        # the shape that broke the first-scrape rule: no start time, no _created, no process_* series
        assert "process_start_time_seconds" not in fresh and "_created" not in fresh
    snap = parse_exposition(page(engine, 2), engine)["tiny"]
    assert snap.start_time_s is None and snap.ttft is not None and snap.ttft.count == 28
    assert snap.finished == 28 and snap.failed == 1 and (snap.running, snap.waiting) == (2, 1)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_new_replica_counts_its_first_scrape_from_zero_with_no_start_time(engine: str) -> None:
    # issue 34: a replica that had served 20 requests gave 20 records as vLLM and 0 as SGLang
    s = Scraper(SETTINGS, [OLD], engine)
    assert s.step({OLD.url: page(engine, 1)}, 1_000_000) == []  # the adapter's first round: baseline
    assert requests(s.step({OLD.url: page(engine, 1)}, 1_005_000)) == []
    s.set_endpoints([OLD, NEW])  # scaled in under load: new to discovery, 20 requests served already
    recs = s.step({OLD.url: page(engine, 1), NEW.url: page(engine, 1)}, 1_010_000)
    assert len(requests(recs, NEW.node)) == 20 and all(validate_record(r) is None for r in recs)
    assert all(1_005_000 < r["ts_ms"] <= 1_010_000 for r in requests(recs))  # spread over the last interval
    recs = s.step({OLD.url: page(engine, 1), NEW.url: page(engine, 2)}, 1_015_000)
    assert len(requests(recs, NEW.node)) == 8 and sum(r["status"] == "error" for r in requests(recs)) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_target_that_comes_back_is_not_counted_twice(engine: str) -> None:
    s = Scraper(SETTINGS, [OLD, NEW], engine)
    s.step({OLD.url: page(engine, 1)}, 1_000_000)
    s.step({OLD.url: page(engine, 1), NEW.url: page(engine, 1)}, 1_005_000)  # new: its 20 counted
    s.set_endpoints([OLD])  # flapped out of discovery (its baseline dropped) ...
    s.set_endpoints([OLD, NEW])  # ... and back, no start time: a baseline, not its 20 again
    assert requests(s.step({NEW.url: page(engine, 1)}, 1_010_000)) == []
    # where discovery knows it restarted since the previous round (a pod's startTime), from zero
    s.set_endpoints([OLD])
    restarted = Endpoint(NEW.url, "az-a", start_time_s=1_012.0)
    s.set_endpoints([OLD, restarted])
    assert len(requests(s.step({NEW.url: page(engine, 1)}, 1_015_000))) == 20


def test_a_discovery_start_time_before_the_adapter_keeps_the_baseline() -> None:
    s = Scraper(SETTINGS, [OLD], "sglang")
    s.step({OLD.url: page("sglang", 1)}, 1_000_000)
    s.step({OLD.url: page("sglang", 1)}, 1_005_000)
    old_engine = Endpoint(NEW.url, "az-a", start_time_s=900.0)  # running before the adapter's first round
    s.set_endpoints([OLD, old_engine])
    assert requests(s.step({NEW.url: page("sglang", 1)}, 1_010_000)) == []


def test_once_counts_the_first_round_from_zero() -> None:
    s = Scraper(SETTINGS, [NEW], "sglang", first_from_zero=True)
    recs = s.step({NEW.url: page("sglang", 2)}, 1_000_000)
    assert len(requests(recs)) == 28 and recs[-1]["kind"] == "gpu"


def test_discovery_carries_start_times() -> None:
    doc = b'[{"targets": ["10.0.0.5:8000"], "labels": {"zone": "az-a", "__meta_start_time_s": "1700000000.5"}},'
    doc += b' {"targets": ["10.0.0.6:8000"], "labels": {"zone": "az-a", "__meta_start_time_s": "soon"}}]'
    eps, problems = parse_http_sd(doc)
    assert [ep.start_time_s for ep in eps] == [1_700_000_000.5, None] and "not unix seconds" in problems[0]
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    pod = SimpleNamespace(
        metadata=SimpleNamespace(name="e-0", labels={"zone": "az-a"}, deletion_timestamp=None),
        spec=SimpleNamespace(node_name="n1"),
        status=SimpleNamespace(
            phase="Running",
            pod_ip="10.0.0.7",
            start_time=started,
            conditions=[SimpleNamespace(type="Ready", status="True")],
        ),
    )

    class Core:
        def __init__(self, _client: Any) -> None: ...

        def list_namespaced_pod(self, *_a: Any, **_k: Any) -> Any:
            return SimpleNamespace(items=[pod])

    import kubernetes.client

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kubernetes.client, "CoreV1Api", Core)
        (ep,) = KubernetesTargets("app=engine", "llm", api_client=object()).targets()
    assert ep.start_time_s == started.timestamp() and ep == Endpoint("http://10.0.0.7:8000/metrics", "az-a")


def test_a_wrong_engine_is_warned_about_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    s = Scraper(SETTINGS, [NEW], "sglang")
    with caplog.at_level(logging.WARNING, logger="adapters.scrape.runner"):
        for t in (1_000_000, 1_005_000):
            assert s.step({NEW.url: page("vllm", 1)}, t) == []
    assert s.stats["no_engine_series"] == 2  # counted every scrape, warned once
    (msg,) = [r.getMessage() for r in caplog.records if "no sglang: series" in r.getMessage()]
    assert "--engine vllm" in msg and NEW.url in msg


def test_a_served_name_with_no_model_is_warned_about_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(models=(ModelSpec("llama", ttft_slo_ms=1000.0, itl_slo_ms=150.0),))
    s = Scraper(settings, [NEW], "vllm")
    with caplog.at_level(logging.WARNING, logger="adapters.scrape.runner"):
        s.step({NEW.url: page("vllm", 1)}, 1_000_000)
        s.step({NEW.url: page("vllm", 2)}, 1_005_000)
    assert s.stats["unmapped_model"] == 2
    (msg,) = [r.getMessage() for r in caplog.records if "not a configured model" in r.getMessage()]
    assert "'tiny'" in msg and "--model-map tiny=MODEL" in msg and "llama" in msg
    mapped = Scraper(settings, [NEW], "vllm", {"tiny": "llama"})
    mapped.step({NEW.url: page("vllm", 1)}, 1_000_000)
    assert mapped.stats["unmapped_model"] == 0


def test_an_slo_off_the_bucket_edges_is_warned_about_with_the_flag_to_add_one(caplog: pytest.LogCaptureFixture) -> None:
    for engine, flag in (("sglang", "--bucket-inter-token-latency"), ("vllm", "--custom-histogram-buckets")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="adapters.scrape.runner"):
            # ITL SLO 150 ms: SGLang's edges 100/200 ms; vLLM has 150 ms.  Said at start (the
            # engine's default edges), not again when the first scrape shows the same edges.
            s = Scraper(SETTINGS, [NEW], engine)
            assert s.stats["slo_off_edge"] == (engine == "sglang")
            s.step({NEW.url: page(engine, 1)}, 1_000_000)
            s.step({NEW.url: page(engine, 2)}, 1_005_000)
        msgs = [r.getMessage() for r in caplog.records if "not a bucket edge" in r.getMessage()]
        if engine == "sglang":
            (msg,) = msgs
            assert "nearest edges 100 ms and 200 ms" in msg and flag in msg and s.stats["slo_off_edge"] == 1
        else:
            assert msgs == [] and s.stats["slo_off_edge"] == 0
    off = Settings(models=(ModelSpec("tiny", ttft_slo_ms=300.0, itl_slo_ms=150.0),))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="adapters.scrape.runner"):
        s = Scraper(off, [NEW], "vllm")
        s.step({NEW.url: page("vllm", 1)}, 1_000_000)
    (msg,) = [r.getMessage() for r in caplog.records if "not a bucket edge" in r.getMessage()]
    assert "250 ms and 500 ms" in msg and "'{\"time_to_first_token\": [..., 0.3, ...]}'" in msg
