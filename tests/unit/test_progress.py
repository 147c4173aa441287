"""The demo's progress: plain bounded lines when not a terminal, one redrawn line in one (issue 34 item 8)."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

from governor.demo import _progress
from launch.progress import ProgressWriter


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _demo_ticks(out: io.StringIO, clock: _Clock, ticks: int, step_s: float) -> None:
    """Drive the demo's own progress tick ``ticks`` times, ``step_s`` apart on the writer's clock."""
    fleet = SimpleNamespace(replicas=lambda zone, model: {"ready": 4, "starting": 1})
    live = SimpleNamespace(fleet=fleet, stats=SimpleNamespace(submitted=0))
    col = SimpleNamespace(
        windows=[{"scope": "zone", "violation_rate": 0.02, "ttft_p95_ms": 310.0}], results=[], dead_letters=[]
    )
    writer = ProgressWriter(out, clock=clock)
    tick = _progress(live, col, 600.0, ["az-a", "az-b", "az-c"], "m", writer)  # type: ignore[arg-type]

    async def run() -> None:
        for i in range(ticks):
            live.stats.submitted = 16 * i
            await tick(i * 0.5)
            clock.now_s += step_s
        writer.end()

    asyncio.run(run())


def test_demo_progress_into_a_file_is_plain_bounded_lines() -> None:
    out, clock = io.StringIO(), _Clock()
    _demo_ticks(out, clock, ticks=1200, step_s=0.1)  # 120 s of a run, a tick every 0.1 s
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert 1 < len(lines) <= 13  # one every 10 s (and the first), not one per tick
    assert all(0 < len(line) <= 200 for line in lines), max(map(len, lines))
    assert "sent=" in lines[-1] and "az-c=4(+1)" in lines[-1]


def test_demo_progress_in_a_terminal_redraws_one_line() -> None:
    out, clock = _Tty(), _Clock()
    _demo_ticks(out, clock, ticks=50, step_s=0.25)
    text = out.getvalue()
    assert text.count("\r") == 13  # at most once a second: redraws, not new lines
    assert text.count("\n") == 1 and text.endswith("\n")  # end() closes the line


def test_a_long_or_multi_line_update_stays_one_bounded_line() -> None:
    out = io.StringIO()
    writer = ProgressWriter(out, max_chars=80)
    writer.update("x" * 500 + "\n" + "y" * 10)
    assert out.getvalue().count("\n") == 1 and len(out.getvalue().rstrip("\n")) == 80
