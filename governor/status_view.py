"""How ``governor status`` shows a snapshot (:func:`governor.status.collect`): plain aligned
text (piped, or no ``rich``), a ``rich`` table in a terminal, and the ``--watch`` loop.

>>> snap = {"prefix": "g", "paused": False, "pause": None, "worker": {"alive": True, "age_s": 0.4},
...         "executors": {"az-a": {"alive": False, "age_s": None}}, "rows": [],
...         "kafka": {"group": "governor", "lag": None, "dead_letters_60s": 0}}
>>> print(render_plain(snap))  # doctest: +NORMALIZE_WHITESPACE
governor status (prefix g): loop running
worker alive (beat 0.4 s ago); executors: az-a DOWN
kafka: dead letters in the last 60 s: 0; lag of group governor: unavailable
(no (model, zone) has reported a window yet)
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import orjson

from core.settings import Settings

__all__ = ["COLUMNS", "header_lines", "render_plain", "show_once", "show_watch", "table_rows"]

COLUMNS = (
    "MODEL",
    "ZONE",
    "WINDOW",
    "RATE",
    "VIOL",
    "TTFT P95/SLO",
    "READY/START/TARGET",
    "FF",
    "DRIFT",
    "STALE",
    "ZONE ST",
    "LAST COMMAND",
    "BREAKER",
    "CANARY",
)


def _num(v: Any, fmt: str, unit: str = "") -> str:
    return "-" if not isinstance(v, int | float) or isinstance(v, bool) else f"{v:{fmt}}{unit}"


def _ago(age: Any) -> str:
    return "-" if not isinstance(age, int | float) else f"{age:.1f} s ago"


def _command(last: Any) -> str:
    if not isinstance(last, dict):
        return "-"
    what = str(last.get("kind") or "?")
    if last.get("target_replicas") is not None:
        what += f"->{last['target_replicas']}"
    reason = f" ({str(last['reason'])[:40]})" if last.get("reason") and last.get("outcome") != "applied" else ""
    return f"{what} {last.get('outcome', '?')}{reason} {_ago(last.get('age_s'))}"


def _drift(d: Any) -> str:
    if not isinstance(d, dict):
        return "-"
    return f"{d.get('signal', '?')} {d.get('direction') or ''}".strip()


def table_rows(snap: dict[str, Any]) -> list[list[str]]:
    """One row of :data:`COLUMNS` per (model, zone)."""
    out = []
    for r in snap.get("rows", []):
        canary = r.get("canary")
        out.append(
            [
                str(r.get("model")),
                str(r.get("zone")),
                _ago(r.get("window_age_s")),
                _num(r.get("rate_rps"), ".1f", "/s"),
                _num(r.get("violation_rate"), ".0%")
                + (f" ({_num(u, '.0%')} unfix.)" if (u := r.get("unfixable_rate")) else ""),
                f"{_num(r.get('ttft_p95_ms'), '.0f')}/{_num(r.get('ttft_slo_ms'), '.0f')} ms",
                f"{r.get('replicas_ready', '-')}/{r.get('replicas_starting', '-')}/{_num(r.get('target'), 'd')}",
                {True: "on", False: "off"}.get(r.get("ff_mode"), "-"),
                _drift(r.get("drift")),
                f"STALE ({r.get('stale_reason')})" if r.get("stale") else "no",
                str(r.get("zone_status") or "-"),
                _command(r.get("last_command")),
                str(r.get("breaker") or "-"),
                "-"
                if not isinstance(canary, dict)
                else f"{canary.get('state')} {_num(canary.get('share'), '.0%')}".strip(),
            ]
        )
    return out


def header_lines(snap: dict[str, Any]) -> list[str]:
    """The fleet-wide lines above the table."""
    pause: dict[str, Any] = snap["pause"] if isinstance(snap.get("pause"), dict) else {}
    state = f"PAUSED ({pause.get('reason', '')})" if snap.get("paused") else "loop running"
    worker = snap.get("worker", {})
    w = f"worker alive (beat {_ago(worker.get('age_s'))})" if worker.get("alive") else "worker DOWN (no heartbeat)"
    execs = ", ".join(
        f"{z} alive ({_ago(e.get('age_s'))})" if e.get("alive") else f"{z} DOWN"
        for z, e in snap.get("executors", {}).items()
    )
    k = snap.get("kafka", {})
    dl = k.get("dead_letters_60s")
    lag = k.get("lag")
    lag_s = (
        "unavailable"
        if not isinstance(lag, dict)
        else ", ".join(f"{t} {'-' if n is None else n}" for t, n in lag.items())
    )
    kafka = f"kafka: dead letters in the last 60 s: {'-' if dl is None else dl}; lag of group {k.get('group')}: {lag_s}"
    if k.get("error"):
        kafka += f" (error: {k['error']})"
    return [f"governor status (prefix {snap.get('prefix')}): {state}", f"{w}; executors: {execs or '-'}", kafka]


def render_plain(snap: dict[str, Any]) -> str:
    """The snapshot as aligned text (what a pipe gets)."""
    lines = header_lines(snap)
    rows = table_rows(snap)
    if not rows:
        return "\n".join([*lines, "(no (model, zone) has reported a window yet)"])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    for r in [list(COLUMNS), *rows]:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _rich(snap: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = [Text(line, style="bold red" if "PAUSED" in line or "DOWN" in line else "") for line in header_lines(snap)]
    if not snap.get("rows"):
        return Group(*head, Text("(no (model, zone) has reported a window yet)"))
    table = Table(*COLUMNS, header_style="bold", expand=False)
    for r in table_rows(snap):
        style = "red" if r[9] != "no" or "DOWN" in r[10] else None
        table.add_row(*r, style=style)
    return Group(*head, table)


def _rich_available() -> bool:
    if not sys.stdout.isatty():
        return False
    try:
        import rich  # noqa: F401 - optional: not a dependency of governor
    except ImportError:
        return False
    return True


def show_once(snap: dict[str, Any], *, as_json: bool = False) -> None:
    """One look: JSON, a ``rich`` table in a terminal, else plain text."""
    if as_json:
        print(orjson.dumps(snap).decode(), flush=True)
    elif _rich_available():
        from rich.console import Console

        Console().print(_rich(snap))
    else:
        print(render_plain(snap), flush=True)


def show_watch(settings: Settings, first: dict[str, Any], every_s: float, *, as_json: bool = False) -> int:
    """Refresh every ``every_s`` until Ctrl-C; a failed look is shown and retried."""
    from governor.status import Unreachable, collect

    def look() -> dict[str, Any] | str:
        try:
            return asyncio.run(asyncio.wait_for(collect(settings), 9.0))
        except (Unreachable, TimeoutError) as exc:
            return str(exc) or "governor status: no answer within 9 s"

    snap: dict[str, Any] | str = first
    try:
        if _rich_available() and not as_json:
            from rich.live import Live

            with Live(_rich(first), auto_refresh=False) as live:
                while True:
                    time.sleep(every_s)
                    snap = look()
                    live.update(_rich(snap) if isinstance(snap, dict) else snap, refresh=True)
        while True:
            if isinstance(snap, dict):
                print(orjson.dumps(snap).decode() if as_json else render_plain(snap) + "\n", flush=True)
            else:
                print(snap, file=sys.stderr, flush=True)
            time.sleep(every_s)
            snap = look()
    except KeyboardInterrupt:
        return 0
