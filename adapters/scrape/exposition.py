"""The engines' exposition text -> :class:`adapters.scrape.deltas.Snapshot` per served model.

Metric names and labels are the engines' own (vLLM ``vllm/v1/metrics/loggers.py``,
SGLang ``python/sglang/srt/metrics/collector.py``): series are grouped by ``model_name``
and summed over the other labels (vLLM's ``engine`` index under data parallelism).
Both the direct scrape (:mod:`adapters.scrape.runner`, exposition text) and the PromQL
source (:mod:`adapters.scrape.promql`, samples from Prometheus' query API) go through
:func:`snapshots_from_samples`, so both read the same numbers the same way.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from adapters.scrape.deltas import Histogram, Snapshot

__all__ = ["ENGINES", "MAX_MODELS_PER_TARGET", "Sample", "parse_exposition", "snapshots_from_samples"]

log = logging.getLogger(__name__)

MAX_MODELS_PER_TARGET = 64  # served models one replica may report (a hostile exposition is not unbounded state)

# (ttft, [(itl name, per request)], e2e, queue, finished counter, failed counter or reasons,
#  prompt, generation, running, waiting, [kv usage gauges], kv total)
ENGINES: dict[str, dict[str, Any]] = {
    "vllm": {
        "prefix": "vllm:",
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": [
            ("vllm:request_time_per_output_token_seconds", True),
            ("vllm:inter_token_latency_seconds", False),
            ("vllm:time_per_output_token_seconds", False),
        ],
        "e2e": "vllm:e2e_request_latency_seconds",
        "queue": "vllm:request_queue_time_seconds",
        "finished": "vllm:request_success",
        "ok_reasons": ("stop", "length"),
        "prompt": "vllm:prompt_tokens",
        "output": "vllm:generation_tokens",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "kv": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        # default edges (vllm/v1/metrics/buckets.py), checked against the SLOs at start
        "ttft_edges": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
        + (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
        "itl_edges": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
        + (20.0, 40.0, 80.0),
    },
    "sglang": {
        "prefix": "sglang:",
        "ttft": "sglang:time_to_first_token_seconds",
        "itl": [("sglang:inter_token_latency_seconds", False)],
        "e2e": "sglang:e2e_request_latency_seconds",
        "finished": "sglang:num_requests",
        "failed": "sglang:num_aborted_requests",
        "prompt": "sglang:prompt_tokens",
        "output": "sglang:generation_tokens",
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
        "kv": ("sglang:token_usage",),
        "kv_total": "sglang:max_total_num_tokens",
        # default edges (srt/metrics/collector.py, TokenizerMetricsCollector)
        "ttft_edges": (
            0.1,
            0.2,
            0.4,
            0.6,
            0.8,
            1.0,
            2.0,
            4.0,
            6.0,
            8.0,
            10.0,
            20.0,
            40.0,
            60.0,
            80.0,
            100.0,
            200.0,
            400.0,
        ),
        "itl_edges": (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1)
        + (0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0),
    },
}


@dataclass
class _Series:
    """The samples of one ``model_name``: scalar sums by name, histograms by name, reasons."""

    scalars: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    buckets: dict[str, dict[float, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    reasons: dict[str, float] = field(default_factory=lambda: defaultdict(float))


def _histogram(s: _Series, name: str, per_request: bool = True) -> Histogram | None:
    b = s.buckets.get(name)
    if not b:
        return None
    edges = sorted(e for e in b if e != float("inf"))
    cum = tuple(b[e] for e in edges) + (b.get(float("inf"), b[edges[-1]] if edges else 0.0),)
    return Histogram(tuple(edges), cum, s.sums.get(name, 0.0), per_request, name)


# (family name, family type, sample name, labels, value): one sample as the exposition parser gives it
Sample = tuple[str, str, str, dict[str, str], float]


def parse_exposition(text: str, engine: str, seen: set[str] | None = None) -> dict[str, Snapshot]:
    """Exposition text -> one :class:`Snapshot` per ``model_name`` (ValueError: not exposition);
    ``seen`` gets the engines (:data:`ENGINES`) that have at least one series in it."""
    samples = (
        (fam.name, fam.type, smp.name, smp.labels, float(smp.value))
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
    )
    return snapshots_from_samples(samples, engine, seen)


_PREFIXES = {spec["prefix"]: name for name, spec in ENGINES.items()}


def snapshots_from_samples(samples: Iterable[Sample], engine: str, seen: set[str] | None = None) -> dict[str, Snapshot]:
    """Samples of one replica -> one :class:`Snapshot` per ``model_name`` (at most
    ``MAX_MODELS_PER_TARGET``; the others are dropped with a warning).  ``seen`` (when given)
    gets the engines with at least one series among the samples (a wrong ``--engine`` shows
    as ``engine not in seen``)."""
    spec = ENGINES[engine]
    by_model: dict[str, _Series] = defaultdict(_Series)
    start: float | None = None
    kv_blocks: int | None = None
    dropped: set[str] = set()
    for fam_name, fam_type, name, labels, value in samples:
        if seen is not None and (other := _PREFIXES.get(name[: name.find(":") + 1])) is not None:
            seen.add(other)
        if name == "process_start_time_seconds":
            start = value
            continue
        if name == "vllm:cache_config_info" and labels.get("num_gpu_blocks", "").isdigit():
            kv_blocks = (kv_blocks or 0) + int(labels["num_gpu_blocks"])
            continue
        model = labels.get("model_name", "")
        if model not in by_model and len(by_model) >= MAX_MODELS_PER_TARGET:
            dropped.add(model)
            continue
        s = by_model[model]
        if name.endswith("_bucket") and "le" in labels:
            s.buckets[fam_name][float(labels["le"])] += value
        elif name == fam_name + "_sum" and fam_type == "histogram":
            s.sums[fam_name] += value
        elif name == fam_name + "_total" and "finished_reason" in labels:
            s.reasons[labels["finished_reason"]] += value
        elif name in (fam_name, fam_name + "_total"):
            s.scalars[fam_name] += value
            s.counts[fam_name] += 1
    if dropped:
        log.warning("over %d model_name values on one replica: %d dropped", MAX_MODELS_PER_TARGET, len(dropped))
    out: dict[str, Snapshot] = {}
    for model, s in by_model.items():
        ttft = _histogram(s, spec["ttft"])
        if ttft is None and not any(k in s.scalars for k in (spec["running"], spec["waiting"])):
            continue  # no engine series under this label set (process_*, python_* ...)
        itl = next((h for n, per in spec["itl"] if (h := _histogram(s, n, per)) is not None), None)
        if "ok_reasons" in spec:
            finished = sum(s.reasons.values())
            failed = sum(v for r, v in s.reasons.items() if r not in spec["ok_reasons"])
        else:
            finished, failed = s.scalars.get(spec["finished"], 0.0), s.scalars.get(spec["failed"], 0.0)
        kv_name = next((k for k in spec["kv"] if k in s.scalars), None)
        kv_usage = s.scalars[kv_name] / max(1, s.counts[kv_name]) if kv_name else None
        kv_total = int(s.scalars[spec["kv_total"]]) if spec.get("kv_total") in s.scalars else kv_blocks
        out[model] = Snapshot(
            ttft=ttft,
            itl=itl,
            e2e=_histogram(s, spec["e2e"]),
            queue=_histogram(s, spec["queue"]) if "queue" in spec else None,
            finished=finished,
            failed=failed,
            prompt_tokens=s.scalars.get(spec["prompt"], 0.0),
            output_tokens=s.scalars.get(spec["output"], 0.0),
            running=s.scalars.get(spec["running"], 0.0),
            waiting=s.scalars.get(spec["waiting"], 0.0),
            kv_usage=kv_usage,
            kv_total=kv_total,
            start_time_s=start,
        )
    return out
