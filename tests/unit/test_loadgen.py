"""The load client (engines/loadgen.py, issue 33 item 3): the schedule it sends, and its own
accounting of requests that fail, time out or are cut, against a small aiohttp server that
misbehaves on purpose (the real engine: tests/integration/test_loadgen_vllm.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.loadgen import LoadClass, LoadError, LoadResult, RequestResult, RequestSpec, replay, schedule
from sim.traces import load_trace
from sim.workloads import step_load

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _workload(n: int = 50) -> SimpleNamespace:
    return SimpleNamespace(
        arrival_s=[0.5 * i for i in range(n)],
        prompt_tokens=[10 * (i + 1) for i in range(n)],
        output_tokens=[3 * (i + 1) for i in range(n)],
    )


# --- schedule: pure --------------------------------------------------------------------------


def test_the_same_workload_gives_the_same_specs() -> None:
    w = step_load(load_trace("azure-conv"), 4.0, 30.0, 15.0, 2.0)
    mix = [LoadClass("trading", priority=0), LoadClass("voice", priority=1), LoadClass("batch", 2.0, priority=2)]
    a = schedule(w, speed=2.0, max_prompt_tokens=256, max_output_tokens=32, classes=mix, seed=3)
    b = schedule(w, speed=2.0, max_prompt_tokens=256, max_output_tokens=32, classes=mix, seed=3)
    assert a == b and len(a) == len(w)
    assert {s.request_class for s in a} == {"trading", "voice", "batch"}
    assert all(s.priority == {"trading": 0, "voice": 1, "batch": 2}[s.request_class or ""] for s in a)
    assert [s.request_class for s in a] != [
        s.request_class
        for s in schedule(w, speed=2.0, max_prompt_tokens=256, max_output_tokens=32, classes=mix, seed=4)
    ]


def test_speed_divides_the_arrival_times() -> None:
    w = _workload()
    one = schedule(w, max_prompt_tokens=10_000, max_output_tokens=10_000)
    four = schedule(w, speed=4.0, max_prompt_tokens=10_000, max_output_tokens=10_000)
    assert [s.at_s for s in four] == [s.at_s / 4.0 for s in one]
    assert [s.prompt_tokens for s in four] == [s.prompt_tokens for s in one] == w.prompt_tokens


def test_lengths_are_scaled_then_clipped_to_the_context() -> None:
    specs = schedule(_workload(), max_prompt_tokens=100, max_output_tokens=20, length_scale=0.5)
    assert [s.prompt_tokens for s in specs[:4]] == [5, 10, 15, 20]
    assert max(s.prompt_tokens for s in specs) == 100 and max(s.output_tokens for s in specs) == 20
    zero = SimpleNamespace(arrival_s=[0.0], prompt_tokens=[0], output_tokens=[0])
    assert schedule(zero, max_prompt_tokens=8, max_output_tokens=8)[0] == RequestSpec(0.0, 1, 1)


def test_no_classes_means_no_class_and_no_priority() -> None:
    assert all(
        s.request_class is None and s.priority is None
        for s in schedule(_workload(), max_prompt_tokens=8, max_output_tokens=8)
    )


def test_the_specs_come_in_arrival_order() -> None:
    w = SimpleNamespace(arrival_s=[2.0, 0.0, 1.0], prompt_tokens=[3, 1, 2], output_tokens=[3, 1, 2])
    assert [s.prompt_tokens for s in schedule(w, max_prompt_tokens=8, max_output_tokens=8)] == [1, 2, 3]


@settings(derandomize=True, max_examples=50, deadline=None)
@given(shares=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=3), seed=st.integers(0, 2**32))
def test_the_class_draw_is_deterministic_and_follows_the_shares(shares: list[float], seed: int) -> None:
    mix = [LoadClass(f"c{i}", share) for i, share in enumerate(shares)]
    w = SimpleNamespace(arrival_s=[0.0] * 400, prompt_tokens=[1] * 400, output_tokens=[1] * 400)
    drawn = [s.request_class for s in schedule(w, max_prompt_tokens=1, max_output_tokens=1, classes=mix, seed=seed)]
    assert drawn == [
        s.request_class for s in schedule(w, max_prompt_tokens=1, max_output_tokens=1, classes=mix, seed=seed)
    ]
    for c in mix:  # 400 draws: each share within 0.12 of its weight (about 5 standard deviations)
        assert abs(drawn.count(c.name) / 400 - c.share / sum(shares)) < 0.12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"speed": 0.0}, "speed=0.0: must be a finite number > 0"),
        ({"max_prompt_tokens": 0}, "max_prompt_tokens=0: must be an int >= 1"),
        ({"max_output_tokens": 2.5}, "max_output_tokens=2.5: must be an int >= 1"),
        ({"length_scale": float("nan")}, "length_scale=nan: must be a finite number > 0"),
    ],
)
def test_bad_schedule_parameters_are_named(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"max_prompt_tokens": 8, "max_output_tokens": 8, **kwargs}
    with pytest.raises(LoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        schedule(_workload(), **args)


def test_a_bad_class_is_named() -> None:
    with pytest.raises(LoadError, match="share=0: must be a finite number > 0"):
        LoadClass("x", share=0)
    with pytest.raises(LoadError, match="priority='1': must be an int or None"):
        LoadClass("x", priority="1")  # type: ignore[arg-type]


# --- the summary: every request counts ---------------------------------------------------------


def test_the_summary_counts_every_request_against_the_attainment() -> None:
    spec = RequestSpec(0.0, 4, 4)
    results = [
        RequestResult(spec, 0.0, "ok", 200, ttft_s=0.1, itl_s=0.01, e2e_s=0.2, output_tokens=4),
        RequestResult(spec, 0.0, "ok", 200, ttft_s=0.9, itl_s=0.01, e2e_s=1.0, output_tokens=4),  # TTFT over
        RequestResult(spec, 0.0, "failed", None, error="refused"),
        RequestResult(spec, 0.0, "timeout", 200, ttft_s=0.1, e2e_s=5.0, output_tokens=2),
        RequestResult(spec, 0.0, "cut", 200, ttft_s=0.1, itl_s=0.01, e2e_s=0.2, output_tokens=2),
    ]
    s = LoadResult(results, started_unix_s=1000.0).summary(ttft_slo_ms=500.0, itl_slo_ms=50.0)
    assert s["counts"] == {"ok": 2, "failed": 1, "timeout": 1, "cut": 1} and s["requests"] == 5
    assert s["attainment"] == pytest.approx(1 / 5)
    assert s["p50_ttft_ms"] == pytest.approx(500.0)  # over the ok ones: 100 and 900
    windows = LoadResult(results, started_unix_s=1000.0).windows(1.0)
    assert sum(w["requests"] for w in windows) == 5 and [w["start_unix_s"] for w in windows] == [1000.0]


# --- replay against a server that misbehaves -------------------------------------------------


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    yield start
    for r in runners:
        await r.cleanup()


def _event(text: str = "x", usage: int | None = None) -> bytes:
    body: dict[str, Any] = {"choices": [{"index": 0, "text": text}] if usage is None else []}
    if usage is not None:
        body["usage"] = {"completion_tokens": usage}
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def _stream(request: web.Request, tokens: int, *, done: bool = True, usage: bool = True) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(tokens):
        await resp.write(_event())
        await asyncio.sleep(0.002)
    if usage:
        await resp.write(_event(usage=tokens))
    if done:
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def test_a_stream_cut_mid_way_is_counted_cut(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def cut(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_event())
        await resp.write(_event())
        assert request.transport is not None
        request.transport.close()  # the engine went away mid-stream
        return resp

    result = await replay(await serve(cut), "m", [RequestSpec(0.0, 4, 8)], timeout_s=10)
    (r,) = result.results
    assert r.status == "cut" and r.http_status == 200 and r.output_tokens == 2, r
    assert r.ttft_s is not None and r.e2e_s is not None and r.ttft_s <= r.e2e_s


async def test_a_stream_short_of_its_tokens_or_its_done_is_cut(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def short(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return await _stream(request, body["max_tokens"] - 1)

    async def no_done(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return await _stream(request, body["max_tokens"], done=False)

    (a,) = (await replay(await serve(short), "m", [RequestSpec(0.0, 4, 5)])).results
    assert (a.status, a.output_tokens, a.error) == ("cut", 4, "stream ended after 4 of 5 tokens")
    (b,) = (await replay(await serve(no_done), "m", [RequestSpec(0.0, 4, 5)])).results
    assert (b.status, b.output_tokens) == ("cut", 5) and b.error is not None and "without [DONE]" in b.error


async def test_an_http_error_is_failed_with_its_status_and_body(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no such model"}}, status=404)

    (r,) = (await replay(await serve(refuse), "m", [RequestSpec(0.0, 4, 5)])).results
    assert (r.status, r.http_status, r.ttft_s, r.e2e_s) == ("failed", 404, None, None)
    assert r.error is not None and "no such model" in r.error


async def test_a_slow_request_times_out_and_the_others_do_not_wait_for_it(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    async def slow_first(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body["max_tokens"] == 9:
            await asyncio.sleep(3)
        return await _stream(request, body["max_tokens"])

    specs = [RequestSpec(0.0, 4, 9), RequestSpec(0.05, 4, 3)]
    slow, fast = (await replay(await serve(slow_first), "m", specs, timeout_s=2.0)).results
    assert slow.status == "timeout" and slow.error == "not finished 2 s after it was due"
    assert slow.e2e_s is not None and slow.e2e_s >= 2.0 and slow.output_tokens == 0
    assert fast.status == "ok" and fast.output_tokens == 3


async def test_concurrency_is_bounded_and_the_wait_for_a_slot_counts(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    in_flight = peak = 0
    bodies: list[dict[str, Any]] = []

    async def count(request: web.Request) -> web.StreamResponse:
        nonlocal in_flight, peak
        bodies.append(await request.json())
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(0.1)
            return await _stream(request, 2)
        finally:
            in_flight -= 1

    specs = [RequestSpec(0.0, 3, 2)] * 6 + [RequestSpec(0.0, 3, 2, "trading", 0)]
    result = await replay(await serve(count), "m", specs, concurrency=2)
    assert peak == 2 and result.counts() == {"ok": 7, "failed": 0, "timeout": 0, "cut": 0}
    for r in result.results:  # open loop: all due at 0; the queued ones' wait is in their TTFT
        assert r.sent_s is not None and r.ttft_s is not None and r.ttft_s >= r.sent_s - r.spec.at_s
    assert max(r.sent_s or 0.0 for r in result.results) >= 0.2  # three rounds of two slots
    # priority is sent only when the spec has one; every request asks for usage and ignores EOS
    assert sum("priority" in b for b in bodies) == 1 and [b["priority"] for b in bodies if "priority" in b] == [0]
    assert all(b["ignore_eos"] and b["stream"] and b["stream_options"] == {"include_usage": True} for b in bodies)
    assert len({tuple(b["prompt"]) for b in bodies}) == 7  # no two prompts alike (no prefix-cache hits)


async def test_a_garbled_event_is_named_and_its_request_cut(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def huge(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_event())
        await resp.write(b"data: " + b"x" * 300_000 + b"\n\n")
        await resp.write_eof()
        return resp

    (r,) = (await replay(await serve(huge), "m", [RequestSpec(0.0, 4, 5)])).results
    assert (r.status, r.output_tokens) == ("cut", 1) and (r.error or "").startswith("bad event: b'xxx")


async def test_a_dead_port_is_failed() -> None:
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (r,) = (await replay(f"http://127.0.0.1:{port}", "m", [RequestSpec(0.0, 4, 5)])).results
    assert (r.status, r.http_status, r.sent_s is not None) == ("failed", None, True)
    assert r.error is not None and "ClientConnectorError" in r.error


async def test_bad_replay_parameters_are_named() -> None:
    with pytest.raises(LoadError, match="concurrency=0: must be an int >= 1"):
        await replay("http://127.0.0.1:1", "m", [], concurrency=0)
    with pytest.raises(LoadError, match="timeout_s=-1: must be a finite number > 0"):
        await replay("http://127.0.0.1:1", "m", [], timeout_s=-1)
