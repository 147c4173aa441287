"""The load client: a trace's requests replayed against a real OpenAI endpoint, measured at the client.

:func:`schedule` turns a workload (the same arrival schedule the simulated fleet replays, built by
the caller from ``sim.workloads``) into :class:`RequestSpec`; :func:`replay` sends them open loop at
their times, streaming ``/v1/completions``, and measures each request's time to first token,
inter-token latency and end-to-end latency where the user would: at the client.  These are the
ground truth the engines' own figures are checked against.

Open loop: a request is due at ``t0 + at_s`` whatever happened to the ones before it.  At most
``concurrency`` are in flight; a due request whose slot is not free waits, and that wait counts in
its latencies (they run from when it was due, the client's truth).  Every spec gives exactly one
:class:`RequestResult`, whose ``status`` is one of:

- ``ok``: HTTP 200, ``max_tokens`` tokens, then ``[DONE]``;
- ``failed``: no answer (connection refused, reset before a response) or an HTTP error status;
- ``timeout``: not finished ``timeout_s`` after it was due (waiting for a slot included);
- ``cut``: HTTP 200, but the stream ended before ``max_tokens`` tokens or before ``[DONE]``.

None is dropped from the figures: :meth:`LoadResult.summary`'s attainment counts every request
that is not ``ok`` as a violation.

>>> from types import SimpleNamespace
>>> w = SimpleNamespace(arrival_s=[0.0, 1.0, 3.0], prompt_tokens=[100, 4000, 7], output_tokens=[20, 900, 0])
>>> [(s.at_s, s.prompt_tokens, s.output_tokens) for s in schedule(w, speed=2.0, max_prompt_tokens=1024,
...                                                               max_output_tokens=64)]
[(0.0, 100, 20), (0.5, 1024, 64), (1.5, 7, 1)]
"""

from __future__ import annotations

import asyncio
import bisect
import math
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

import aiohttp
import orjson

__all__ = [
    "LoadClass",
    "LoadError",
    "LoadResult",
    "RequestResult",
    "RequestSpec",
    "Status",
    "Workload",
    "percentile",
    "prompt_ids",
    "replay",
    "schedule",
]

Status = Literal["ok", "failed", "timeout", "cut"]
STATUSES: tuple[Status, ...] = ("ok", "failed", "timeout", "cut")
_ERROR_CHARS = 300


class LoadError(ValueError):
    """A load parameter is unusable; the message names it."""


class Workload(Protocol):
    """What :func:`schedule` reads (``sim.workloads.Workload`` is one): three sequences of one length (numpy arrays or lists)."""

    @property
    def arrival_s(self) -> Iterable[float]: ...

    @property
    def prompt_tokens(self) -> Iterable[int]: ...

    @property
    def output_tokens(self) -> Iterable[int]: ...


@dataclass(frozen=True)
class LoadClass:
    """A request class the load draws from: its name, its share of the requests and the
    ``priority`` its requests carry (None: none sent; vLLM refuses a priority unless the engine
    runs ``--scheduling-policy priority``, where a lower value is served first)."""

    name: str
    share: float = 1.0
    priority: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise LoadError(f"name={self.name!r}: must be a non-empty string")
        if not (isinstance(self.share, int | float) and math.isfinite(self.share) and self.share > 0):
            raise LoadError(f"share={self.share!r}: must be a finite number > 0")
        if self.priority is not None and (isinstance(self.priority, bool) or not isinstance(self.priority, int)):
            raise LoadError(f"priority={self.priority!r}: must be an int or None")


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: when (seconds after the replay's start), how long its prompt and its
    output are (tokens), its class and its ``priority`` (None: not sent); ``prefix``: the group whose
    shared first ``prefix_tokens`` prompt tokens it starts with (None: a prompt of its own)."""

    at_s: float
    prompt_tokens: int
    output_tokens: int
    request_class: str | None = None
    priority: int | None = None
    prefix: int | None = None
    prefix_tokens: int = 0


@dataclass(frozen=True)
class RequestResult:
    """What the client measured of one request.  Times in seconds; ``sent_s`` is when the HTTP
    request went out, after the replay's start (``sent_s - spec.at_s``: the wait for a slot and the
    client's own lag); ``ttft_s`` and ``e2e_s`` run from when it was due (``spec.at_s``);
    ``itl_s`` is the mean gap between its tokens (None with fewer than two);
    ``output_tokens`` the tokens it received (the server's usage count when it sent one)."""

    spec: RequestSpec
    sent_s: float | None
    status: Status
    http_status: int | None = None
    ttft_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    error: str | None = None

    def meets(self, ttft_slo_ms: float, itl_slo_ms: float) -> bool:
        """Within the SLO: ``ok``, its TTFT and its mean ITL (when it has one) within the limits."""
        if self.status != "ok" or self.ttft_s is None:
            return False
        return self.ttft_s * 1000.0 <= ttft_slo_ms and (self.itl_s is None or self.itl_s * 1000.0 <= itl_slo_ms)

    def done_s(self) -> float:
        """When it counts in a window: its first token (when the engine observes its TTFT), else when due."""
        return self.spec.at_s + (self.ttft_s if self.ttft_s is not None else 0.0)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation between order statistics (numpy's
    default), None for no values.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([5.0], 95), percentile([], 50)
    (2.5, 5.0, None)
    """
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 3)


@dataclass
class LoadResult:
    """Every request's result, in the specs' order, and when the replay started (``t0`` as a Unix time)."""

    results: list[RequestResult]
    started_unix_s: float
    duration_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Requests by status (every status named, zeros included)."""
        out: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for r in self.results:
            out[r.status] += 1
        return out

    def summary(self, ttft_slo_ms: float, itl_slo_ms: float) -> dict[str, Any]:
        """Attainment (the share of ALL requests within the SLO: failed, timed out and cut ones count
        against it), P50/P95/P99 of TTFT, ITL and end-to-end latency of the ``ok`` ones (ms), counts."""
        ok = [r for r in self.results if r.status == "ok"]
        n = len(self.results)
        out: dict[str, Any] = {
            "requests": n,
            "counts": self.counts(),
            "attainment": (sum(r.meets(ttft_slo_ms, itl_slo_ms) for r in self.results) / n) if n else None,
            "ttft_slo_ms": ttft_slo_ms,
            "itl_slo_ms": itl_slo_ms,
            "duration_s": round(self.duration_s, 3),
            "output_tokens": sum(r.output_tokens for r in self.results),
        }
        for name in ("ttft", "itl", "e2e"):
            vals = [v for r in ok if (v := getattr(r, f"{name}_s")) is not None]
            for q in (50, 95, 99):
                out[f"p{q}_{name}_ms"] = _ms(percentile(vals, q))
        waits = [r.sent_s - r.spec.at_s for r in self.results if r.sent_s is not None]
        out["max_client_wait_ms"] = _ms(max(waits)) if waits else None
        return out

    def windows(self, window_s: float) -> list[dict[str, Any]]:
        """Per window of the Unix clock (``start_unix_s`` a multiple of ``window_s``, as the loop's
        windows): requests counted at their first token (the moment the engine observes their TTFT;
        those with none at when they were due), with their count, how many were ``ok`` and the P95
        TTFT of those (ms), in time order."""
        if not (math.isfinite(window_s) and window_s > 0):
            raise LoadError(f"window_s={window_s!r}: must be a finite number > 0")
        bins: dict[int, list[RequestResult]] = {}
        for r in self.results:
            bins.setdefault(math.floor((self.started_unix_s + r.done_s()) / window_s), []).append(r)
        out = []
        for k in sorted(bins):
            rs = bins[k]
            ttfts = [r.ttft_s for r in rs if r.status == "ok" and r.ttft_s is not None]
            out.append(
                {
                    "start_unix_s": k * window_s,
                    "requests": len(rs),
                    "ok": sum(r.status == "ok" for r in rs),
                    "p95_ttft_ms": _ms(percentile(ttfts, 95)),
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the run's start, duration, meta and every result."""
        return {
            "started_unix_s": self.started_unix_s,
            "duration_s": self.duration_s,
            "meta": self.meta,
            "results": [asdict(r) for r in self.results],
        }


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
        raise LoadError(f"{name}={value!r}: must be a finite number > 0")


def schedule(
    workload: Workload,
    *,
    speed: float = 1.0,
    max_prompt_tokens: int,
    max_output_tokens: int,
    length_scale: float = 1.0,
    classes: Sequence[LoadClass] = (),
    seed: int = 0,
) -> list[RequestSpec]:
    """The requests of ``workload``, in arrival order, for a model with a small context.

    Times: ``arrival_s / speed`` (``speed`` trace seconds per wall second).  Lengths: each of a
    trace's prompt and output lengths is multiplied by ``length_scale``, rounded, and clipped to
    ``[1, max_prompt_tokens]`` and ``[1, max_output_tokens]`` (pick the two so that their sum fits
    the model's context: 2048 tokens for the tiny model).  Classes: when ``classes`` is given each
    request draws one by its share (``random.Random(seed)``, one draw a request in order, so the
    same seed gives the same classes), with the class's priority.  The workload's prefix hashes,
    if any, are not replayed.

    >>> from types import SimpleNamespace
    >>> w = SimpleNamespace(arrival_s=[0.0, 0.1, 0.2, 0.3, 0.4], prompt_tokens=[8] * 5, output_tokens=[4] * 5)
    >>> mix = [LoadClass("trading", priority=0), LoadClass("batch", share=3.0, priority=2)]
    >>> [(s.request_class, s.priority) for s in schedule(w, max_prompt_tokens=8, max_output_tokens=4, classes=mix,
    ...                                                  seed=2)]
    [('batch', 2), ('batch', 2), ('trading', 0), ('trading', 0), ('batch', 2)]
    """
    _positive("speed", speed)
    _positive("length_scale", length_scale)
    for name, v in (("max_prompt_tokens", max_prompt_tokens), ("max_output_tokens", max_output_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise LoadError(f"{name}={v!r}: must be an int >= 1")
    arrivals, prompts, outputs = (list(workload.arrival_s), list(workload.prompt_tokens), list(workload.output_tokens))
    if not len(arrivals) == len(prompts) == len(outputs):
        raise LoadError("workload: arrival_s, prompt_tokens and output_tokens differ in length")
    rng = random.Random(seed)
    cum: list[float] = []
    for c in classes:
        cum.append((cum[-1] if cum else 0.0) + c.share)
    specs = []
    for t, p, o in sorted(zip(arrivals, prompts, outputs, strict=True), key=lambda x: float(x[0])):
        cls = classes[min(bisect.bisect_right(cum, rng.random() * cum[-1]), len(classes) - 1)] if classes else None
        specs.append(
            RequestSpec(
                at_s=float(t) / speed,
                prompt_tokens=min(max_prompt_tokens, max(1, round(float(p) * length_scale))),
                output_tokens=min(max_output_tokens, max(1, round(float(o) * length_scale))),
                request_class=cls.name if cls else None,
                priority=cls.priority if cls else None,
            )
        )
    return specs


def prompt_ids(index: int, n: int) -> list[int]:
    """The token ids of request ``index``'s prompt of ``n`` tokens: ids in [3, 259), which any
    byte-level vocabulary holds (the tiny model's first two ids are its special tokens), and a
    different sequence for each request so no prompt is served from another's prefix cache.

    >>> prompt_ids(0, 4), prompt_ids(1, 4)[:2]
    ([3, 4, 5, 6], [94, 95])
    """
    start = (index * 91) % 256
    return [3 + (start + k) % 256 for k in range(n)]


def _prompt(index: int, spec: RequestSpec) -> list[int]:
    """Request ``index``'s token ids: its group's shared prefix (seeded by the group), then its own."""
    if spec.prefix is None or spec.prefix_tokens <= 0:
        return prompt_ids(index, spec.prompt_tokens)
    head = min(spec.prefix_tokens, spec.prompt_tokens)
    shared = [3 + x for x in random.Random(spec.prefix).choices(range(256), k=head)]
    return shared + prompt_ids(index, spec.prompt_tokens - head)


@dataclass
class _Stream:
    """What one request's stream gave so far."""

    first_s: float | None = None  # loop time of the first token chunk
    last_s: float | None = None
    chunks: int = 0
    usage_tokens: int | None = None
    done: bool = False
    error: str | None = None


async def _read_stream(resp: aiohttp.ClientResponse, st: _Stream, clock: Any) -> None:
    """Read an OpenAI completion stream (server-sent events) into ``st`` until ``[DONE]`` or its end."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            st.done = True
            return
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            st.error = f"bad event: {data[:100]!r}"
            continue
        if not isinstance(event, dict):
            continue
        if "error" in event:
            st.error = str(event["error"])[:_ERROR_CHARS]
            continue
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            st.usage_tokens = usage["completion_tokens"]
        if event.get("choices"):
            now = clock()
            st.first_s = now if st.first_s is None else st.first_s
            st.last_s = now
            st.chunks += 1


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    index: int,
    spec: RequestSpec,
    due: float,
    slots: asyncio.Semaphore,
    timeout_s: float,
    t0: float,
    clock: Any,
) -> RequestResult:
    """Send one request when due, through a free slot, and measure it; never raises."""
    deadline = due + timeout_s
    delay = due - clock()
    if delay > 0:
        await asyncio.sleep(delay)
    st = _Stream()
    sent: float | None = None
    http_status: int | None = None
    body: dict[str, Any] = {
        "model": model,
        "prompt": _prompt(index, spec),
        "max_tokens": spec.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.priority is not None:
        body["priority"] = spec.priority

    async def send() -> None:
        nonlocal sent, http_status
        async with slots:
            sent = clock()
            async with session.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as resp:
                http_status = resp.status
                if resp.status != 200:
                    st.error = (await resp.text(errors="replace"))[:_ERROR_CHARS]
                    return
                await _read_stream(resp, st, clock)

    status: Status
    try:
        await asyncio.wait_for(send(), timeout=max(0.0, deadline - clock()))
    except TimeoutError:
        status, st.error = "timeout", f"not finished {timeout_s:g} s after it was due"
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
        # the server went away: mid-stream it cut the request, before a response it failed it
        status = "cut" if http_status == 200 else "failed"
        st.error = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
    except (aiohttp.ClientError, OSError) as exc:
        status, st.error = "failed", f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
    else:
        tokens = st.usage_tokens if st.usage_tokens is not None else st.chunks
        if http_status != 200:
            status = "failed"
        elif st.done and tokens >= spec.output_tokens:
            status = "ok"
        else:
            status = "cut"
            st.error = st.error or f"stream ended after {tokens} of {spec.output_tokens} tokens" + (
                "" if st.done else ", without [DONE]"
            )
    end = clock()
    tokens = st.usage_tokens if st.usage_tokens is not None else st.chunks
    ttft = None if st.first_s is None else st.first_s - due
    itl = None
    if st.first_s is not None and st.last_s is not None and max(tokens, st.chunks) > 1:
        itl = (st.last_s - st.first_s) / (max(tokens, st.chunks) - 1)
    return RequestResult(
        spec=spec,
        sent_s=None if sent is None else sent - t0,
        status=status,
        http_status=http_status,
        ttft_s=ttft,
        itl_s=itl,
        e2e_s=end - due if status != "failed" or st.first_s is not None else None,
        output_tokens=tokens,
        error=st.error,
    )


async def replay(
    base_url: str,
    model: str,
    specs: Iterable[RequestSpec],
    *,
    concurrency: int = 64,
    timeout_s: float = 60.0,
    t0: float | None = None,
) -> LoadResult:
    """Send ``specs`` to ``base_url`` (``/v1/completions``, streaming) open loop at ``t0 + at_s``
    (``t0``: the event loop's clock, None = now), at most ``concurrency`` at once; every spec
    gives exactly one result, in order.  Each request asks for ``output_tokens`` tokens with
    ``ignore_eos`` (so its length follows the trace), a token-id prompt (:func:`prompt_ids`) and the
    usage chunk; ``priority`` only when its spec has one."""
    specs = list(specs)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise LoadError(f"concurrency={concurrency!r}: must be an int >= 1")
    _positive("timeout_s", timeout_s)
    loop = asyncio.get_running_loop()
    clock = loop.time
    start = clock() if t0 is None else t0
    started_unix = time.time() - (clock() - start)
    url = base_url.rstrip("/") + "/v1/completions"
    slots = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    # no session-wide timeout: each request's own deadline (timeout_s after it was due) bounds it
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        results = await asyncio.gather(
            *(
                _one(session, url, model, i, s, start + s.at_s, slots, timeout_s, start, clock)
                for i, s in enumerate(specs)
            )
        )
    return LoadResult(
        results=list(results),
        started_unix_s=started_unix,
        duration_s=clock() - start,
        meta={"url": url, "model": model, "concurrency": concurrency, "timeout_s": timeout_s},
    )
