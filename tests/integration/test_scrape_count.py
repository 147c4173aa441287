"""The scrape adapter counts each finished request once, whatever its targets do between scrapes
(issue 34: a local demo's windows summed to 294 requests where the engines served 292).

Real adapter code end to end (``Discovery`` reading an HTTP SD document, ``EndpointCollector``
GETting every listed ``/metrics``, ``Scraper``) against a small aiohttp server per engine whose
availability the test controls: refuse (the port not yet listening, as an engine still starting),
serve a page, or hang past the scrape timeout.  The pages are the real vLLM page
(tests/fixtures/engines/vllm_1.txt) with its counts rewritten.  vLLM observes a request's TTFT
when its first token comes and its e2e latency when it finishes, so a scrape can show TTFT
observations of requests that have not finished: the evidence run had such an interval (2 first
tokens, 0 finished, 2 records) and then counted the same 2 requests again when they finished.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from pathlib import Path
from typing import Any

from aiohttp import web

from adapters.scrape.runner import EndpointCollector, Scraper
from adapters.scrape.targets import Discovery, HttpSdTargets
from core.settings import ModelSpec, Settings

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
SETTINGS = Settings(models=(ModelSpec("tiny", ttft_slo_ms=100.0, itl_slo_ms=25.0),), window_s=10.0)
TIMEOUT_S = 0.5
T0_MS = 1_800_000_000_000
PER_REQUEST = ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_time_per_output_token_seconds")


def vllm_page(first_tokens: int, finished: int, start_s: float) -> str:
    """vllm_1.txt with ``first_tokens`` TTFT observations (0.05 s each) and ``finished`` requests
    (their e2e, queue, per-token and token histograms and ``request_success_total``)."""

    def family(name: str) -> tuple[int, float] | None:
        if name.startswith("vllm:time_to_first_token_seconds"):
            return first_tokens, 0.05
        if name.startswith("vllm:inter_token_latency_seconds"):
            return finished * 8, 0.005
        if any(name.startswith(f"vllm:{f}") for f in PER_REQUEST):
            return finished, 0.05
        return None

    out = []
    for line in (FIX / "vllm_1.txt").read_text().splitlines():
        m = re.match(r"([^\s{]+)(\{[^}]*\})?\s+(\S+)$", line)
        if line.startswith("#") or m is None:
            out.append(line)
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        got = family(name)
        if name == "process_start_time_seconds":
            value = repr(start_s)
        elif name.startswith("vllm:request_success_total"):
            value = str(float(finished)) if 'finished_reason="length"' in labels else "0.0"
        elif name in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total"):
            value = str(float(finished * 8))
        elif got is not None and name.endswith("_bucket"):
            le = float(re.search(r'le="([^"]+)"', labels).group(1))  # type: ignore[union-attr]
            value = str(float(got[0]) if le >= got[1] else 0.0)
        elif got is not None and name.endswith("_count"):
            value = str(float(got[0]))
        elif got is not None and name.endswith("_sum"):
            value = str(got[0] * got[1])
        out.append(f"{name}{labels} {value}")
    return "\n".join(out) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeEngine:
    """One engine's ``/metrics`` (or an SD document at ``/sd``): not listening (refused) until
    :meth:`listen`; then serves :attr:`page`, or hangs past the scrape timeout while :attr:`hang`."""

    def __init__(self, path: str = "/metrics") -> None:
        self.port, self.path, self.page, self.hang = _free_port(), path, "", False
        self._runner: web.AppRunner | None = None

    async def _get(self, _req: web.Request) -> web.Response:
        if self.hang:
            await asyncio.sleep(TIMEOUT_S * 4)
        return web.Response(text=self.page, content_type="application/json" if self.path == "/sd" else "text/plain")

    async def listen(self) -> None:
        app = web.Application()
        app.router.add_get(self.path, self._get)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def test_requests_are_counted_once_through_refusals_hangs_and_unfinished_first_tokens() -> None:
    a, b = FakeEngine(), FakeEngine()  # a: ready before the adapter; b: listed while starting
    await a.listen()
    sd = FakeEngine("/sd")
    sd.page = json.dumps([{"targets": [f"127.0.0.1:{e.port}" for e in (a, b)], "labels": {"zone": "az-a"}}])
    await sd.listen()
    scraper = Scraper(SETTINGS, [], "vllm", model_map={SERVED: "tiny"})
    discovery = Discovery([HttpSdTargets(f"http://127.0.0.1:{sd.port}/sd", timeout_s=TIMEOUT_S)], SETTINGS.zones, 16)
    collector = EndpointCollector(scraper, discovery, timeout_s=TIMEOUT_S)
    a_start_s, b_start_s = T0_MS / 1000 - 30.0, T0_MS / 1000 + 7.0  # b starts during round 2
    # Per 5 s round: a's page (first tokens, finished), whether a hangs past the timeout, b's page
    # or "refuse"/"hang", and the requests that finished since the last good scrape of each target
    # (the engines' access logs): what that round's records must count.
    rounds: list[tuple[tuple[int, int], bool, Any, int]] = [
        ((0, 0), False, "refuse", 0),  # the adapter's first round: baselines
        ((1, 1), False, "refuse", 1),
        ((3, 1), False, "refuse", 0),  # 2 first tokens, 0 finished: the evidence's extra 2
        ((3, 1), False, (1, 0), 0),  # b up: counted from zero (it started after the last round)
        ((3, 1), True, (2, 1), 1),  # a hangs past the timeout; b finished 1
        ((5, 3), False, "hang", 2),  # a: 2 finished, 2 more first tokens
        ((5, 5), False, (2, 2), 2 + 1),  # a: 2 finished whose first tokens came earlier
        ((6, 6), False, (3, 3), 1 + 1),
        ((6, 6), False, (3, 3), 0),
    ]
    counted = []
    try:
        for i, (a_page, a_hang, b_state, _) in enumerate(rounds):
            a.page, a.hang = vllm_page(*a_page, a_start_s), a_hang
            if isinstance(b_state, tuple):
                if b._runner is None:
                    await b.listen()
                b.page, b.hang = vllm_page(b_state[0], b_state[1], b_start_s), False
            elif b_state == "hang":
                b.hang = True
            recs = await collector.collect(T0_MS + 5000 * i)
            counted.append(sum(r["kind"] == "request" for r in recs))
    finally:
        await a.close()
        await b.close()
        await sd.close()
    assert counted == [want for *_, want in rounds]
    assert sum(counted) == 6 + 3  # a finished 6 (0 before the adapter's first round), b 3
