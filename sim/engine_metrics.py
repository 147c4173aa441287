"""vLLM v1 ``/metrics`` of simulated replicas (pure: no I/O, no clock).

Each replica of the simulated fleet keeps the series a vLLM v1 engine keeps
(``vllm/v1/metrics/loggers.py``), cumulative from the replica's start, with
vLLM's own names, label (``model_name``) and bucket edges:

================================================  ==========  ==========================================
series                                            type        from the simulated request / GPU record
================================================  ==========  ==========================================
``vllm:time_to_first_token_seconds``              histogram   ``ttft_ms``
``vllm:request_time_per_output_token_seconds``    histogram   ``itl_ms`` (the request's mean gap)
``vllm:inter_token_latency_seconds``              histogram   ``itl_ms``, ``output_tokens - 1`` times
``vllm:e2e_request_latency_seconds``              histogram   ``e2e_ms``
``vllm:request_queue_time_seconds``               histogram   ``queue_ms``
``vllm:request_success_total{finished_reason}``   counter     ``stop`` (status ok), ``error`` (else)
``vllm:prompt_tokens_total``                      counter     ``prompt_tokens``
``vllm:generation_tokens_total``                  counter     ``output_tokens``
``vllm:num_requests_running`` / ``_waiting``      gauge       GPU record ``running`` / ``queue_len``
``vllm:kv_cache_usage_perc``                      gauge       ``kv_blocks_used / kv_blocks_total``
``vllm:cache_config_info{num_gpu_blocks}``        info        ``kv_blocks_total``
``process_start_time_seconds``                    gauge       the replica's start (trace epoch seconds)
================================================  ==========  ==========================================

The simulator has no per-token gaps, so ``inter_token_latency_seconds`` counts
each request's mean gap once per gap; the per-request histogram is exact.  A
replica that is replaced (a new node) starts from zero with a new
``process_start_time_seconds``, as a restarted engine does.

>>> reg = FleetMetrics(served_name="llama")
>>> reg.observe({"node": "az-a/m/r0", "zone": "az-a", "ts_ms": 2000, "ttft_ms": 120.0, "itl_ms": 30.0,
...              "e2e_ms": 900.0, "queue_ms": 5.0, "prompt_tokens": 10, "output_tokens": 4, "status": "ok"})
>>> text = reg.render("az-a/m/r0")
>>> 'vllm:time_to_first_token_seconds_bucket{le="0.25",model_name="llama"} 1.0' in text
True
>>> 'vllm:request_success_total{finished_reason="stop",model_name="llama"} 1.0' in text
True
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EDGES", "FleetMetrics", "ReplicaMetrics"]

# vLLM v1 bucket edges (vllm/v1/metrics/loggers.py; the same as tests/fixtures/engines/vllm_*.txt).
TTFT_EDGES: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5)
TTFT_EDGES += (5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_EDGES: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
TPOT_EDGES += (7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_EDGES: tuple[float, ...] = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)
LATENCY_EDGES += (60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
E2E = "vllm:e2e_request_latency_seconds"
QUEUE = "vllm:request_queue_time_seconds"

#: name -> (edges, help)
EDGES: dict[str, tuple[tuple[float, ...], str]] = {
    TTFT: (TTFT_EDGES, "Histogram of time to first token in seconds."),
    ITL: (TPOT_EDGES, "Histogram of inter-token latency in seconds."),
    TPOT: (TPOT_EDGES, "Histogram of time_per_output_token_seconds per request."),
    E2E: (LATENCY_EDGES, "Histogram of e2e request latency in seconds."),
    QUEUE: (LATENCY_EDGES, "Histogram of time spent in WAITING phase for request."),
}
REASONS = ("stop", "length", "abort", "error")


@dataclass
class _Hist:
    edges: tuple[float, ...]
    counts: list[float]  # per bucket (not cumulative); the last is +Inf
    total: float = 0.0

    @classmethod
    def new(cls, edges: tuple[float, ...]) -> _Hist:
        return cls(edges, [0.0] * (len(edges) + 1))

    def observe(self, value_s: float, times: float = 1.0) -> None:
        if times <= 0 or value_s != value_s:  # NaN never lands in a bucket
            return
        v = max(0.0, value_s)
        self.counts[bisect.bisect_left(self.edges, v)] += times  # le: v <= edge
        self.total += v * times


@dataclass
class ReplicaMetrics:
    """One replica's cumulative series and last gauges."""

    zone: str
    start_time_s: float
    hists: dict[str, _Hist] = field(default_factory=lambda: {n: _Hist.new(e) for n, (e, _) in EDGES.items()})
    reasons: dict[str, float] = field(default_factory=lambda: dict.fromkeys(REASONS, 0.0))
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    kv_blocks: int = 0

    def observe(self, rec: Mapping[str, Any]) -> None:
        """Count one finished request record (fields in ms, see the module table)."""
        out = _num(rec.get("output_tokens"))
        self.hists[TTFT].observe(_num(rec.get("ttft_ms")) / 1000.0)
        itl_s = _num(rec.get("itl_ms")) / 1000.0
        self.hists[TPOT].observe(itl_s)
        self.hists[ITL].observe(itl_s, max(0.0, out - 1))
        self.hists[E2E].observe(_num(rec.get("e2e_ms")) / 1000.0)
        self.hists[QUEUE].observe(_num(rec.get("queue_ms")) / 1000.0)
        self.reasons["stop" if rec.get("status") == "ok" else "error"] += 1.0
        self.prompt_tokens += _num(rec.get("prompt_tokens"))
        self.generation_tokens += out

    def set_gauges(self, gpu: Mapping[str, Any]) -> None:
        """The gauges from a simulated GPU record."""
        self.running = _num(gpu.get("running"))
        self.waiting = _num(gpu.get("queue_len"))
        total = int(_num(gpu.get("kv_blocks_total")))
        self.kv_blocks = total
        self.kv_usage = min(1.0, _num(gpu.get("kv_blocks_used")) / total) if total > 0 else 0.0


def _num(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def _fmt(v: float) -> str:
    return repr(float(v))


def _labels(model: str, **extra: str) -> str:
    items = {**extra, "model_name": model}
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(items.items()))


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_replica(m: ReplicaMetrics, model: str) -> str:
    """Prometheus text exposition (format 0.0.4) of one replica, as vLLM serves it."""
    lines = [
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {_fmt(m.start_time_s)}",
    ]
    lab = _labels(model)
    for name, value, help_ in (
        ("vllm:num_requests_running", m.running, "Number of requests in model execution batches."),
        ("vllm:num_requests_waiting", m.waiting, "Number of requests waiting to be processed."),
        ("vllm:kv_cache_usage_perc", m.kv_usage, "KV-cache usage. 1 means 100 percent usage."),
    ):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name}{{{lab}}} {_fmt(value)}"]
    if m.kv_blocks > 0:
        info = _labels(model, num_gpu_blocks=str(m.kv_blocks), block_size="16")
        lines += [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f"vllm:cache_config_info{{{info}}} 1.0",
        ]
    for name, value, help_ in (
        ("vllm:prompt_tokens", m.prompt_tokens, "Number of prefill tokens processed."),
        ("vllm:generation_tokens", m.generation_tokens, "Number of generation tokens processed."),
    ):
        lines += [
            f"# HELP {name}_total {help_}",
            f"# TYPE {name}_total counter",
            f"{name}_total{{{lab}}} {_fmt(value)}",
        ]
    lines += [
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
    ]
    lines += [
        f"vllm:request_success_total{{{_labels(model, finished_reason=r)}}} {_fmt(m.reasons[r])}" for r in REASONS
    ]
    for name, (_, help_) in EDGES.items():
        h = m.hists[name]
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        cum = 0.0
        for edge, k in zip((*h.edges, float("inf")), h.counts, strict=True):
            cum += k
            le = "+Inf" if edge == float("inf") else _fmt(edge)
            lines.append(f"{name}_bucket{{{_labels(model, le=le)}}} {_fmt(cum)}")
        lines += [f"{name}_count{{{lab}}} {_fmt(cum)}", f"{name}_sum{{{lab}}} {_fmt(h.total)}"]
    return "\n".join(lines) + "\n"


class FleetMetrics:
    """Every live replica's series, keyed by node; replicas appear with their first record."""

    def __init__(self, served_name: str, epoch_ms0: int = 0) -> None:
        self.served_name = served_name
        self.epoch_ms0 = epoch_ms0
        self.replicas: dict[str, ReplicaMetrics] = {}

    def _replica(self, node: str, zone: str, ts_ms: int) -> ReplicaMetrics:
        m = self.replicas.get(node)
        if m is None:
            m = self.replicas[node] = ReplicaMetrics(zone=zone, start_time_s=ts_ms / 1000.0)
        return m

    def observe(self, rec: Mapping[str, Any]) -> None:
        """One finished request record (``node``, ``zone``, ``ts_ms`` name the replica)."""
        self._replica(str(rec["node"]), str(rec["zone"]), int(rec["ts_ms"])).observe(rec)

    def observe_all(self, records: Iterable[Mapping[str, Any]]) -> None:
        for rec in records:
            self.observe(rec)

    def update(
        self, gpu_records: Iterable[Mapping[str, Any]], ready_states: tuple[str, ...] = ("ready", "draining")
    ) -> None:
        """Set gauges from one GPU snapshot of the whole fleet; a replica absent from it is gone
        (its series go with it) and a starting replica serves no metrics yet."""
        seen = set()
        for g in gpu_records:
            if g.get("state") not in ready_states:
                continue
            node = str(g["node"])
            seen.add(node)
            self._replica(node, str(g["zone"]), int(g["ts_ms"])).set_gauges(g)
        for node in [n for n in self.replicas if n not in seen]:
            del self.replicas[node]

    def render(self, node: str) -> str:
        """The replica's exposition text (KeyError: no such replica)."""
        return render_replica(self.replicas[node], self.served_name)

    def targets(self) -> dict[str, str]:
        """node -> zone of every replica serving metrics now."""
        return {n: m.zone for n, m in self.replicas.items()}
