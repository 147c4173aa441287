"""Admission of periodic agent tasks (controllers/admission.py, loop/admission_driver.py, the CLI offline)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from controllers.admission import AgentTask, admit, evaluate
from controllers.errors import ParameterError
from controllers.window_record import decode_window
from loop.admission_driver import AdmissionDriver


def _task(name: str, period: float, prio: int, **kw: Any) -> AgentTask:
    return AgentTask.from_dict(
        {
            "orchestrator": kw.pop("orch", "desk"),
            "name": name,
            "model": "m",
            "period_ms": period,
            "priority": prio,
            **kw,
        }
    )


def _win(k: int, p99: float, model: str = "m", zone: str = "az-a") -> Any:
    return decode_window(
        {
            "scope": "zone",
            "model": model,
            "zone": zone,
            "window_start_ms": k * 10_000,
            "window_end_ms": (k + 1) * 10_000,
            "window_s": 10.0,
            "count": 100,
            "violation_rate": 0.0,
            "e2e_p99_ms": p99,
        }
    )


def test_evaluate_uses_the_measured_p99_as_execution_time() -> None:
    # C = 120 ms for both. quote (T 300, prio 0): R = 120.  voice (T 500, prio 1): w = 120 -> 120 + 120 = 240
    # -> 120 + ceil(240/300)*120 = 240: R = 240.  Margin (Lehoczky): quote 300/120 = 2.5; voice at its points
    # 300 and 500: W(300) = 120 + 120 = 240 -> 1.25, W(500) = 2*120 + 120 = 360 -> 1.389; lambda* = 500/360.
    ts = [_task("quote", 300, 0), _task("voice", 500, 1)]
    v = evaluate(ts, {"m": 120.0})
    assert v.feasible and [r.response for r in v.results] == [120.0, 240.0]
    assert v.margin == pytest.approx(500 / 360, rel=1e-5)
    # A class measured apart wins over the model's latency.
    cls = _task("voice", 500, 1, request_class="voice")
    assert evaluate([cls], {"m": 120.0, "m|voice": 90.0}).results[0].response == 90.0


def test_admit_rejects_holds_and_admits() -> None:
    quote = _task("quote", 300, 0)
    voice = _task("voice", 500, 1)
    assert admit(voice, [quote], {"m": 120.0}).state == "admitted"
    d = admit(voice, [quote], {"m": 250.0})  # 250 -> 500 -> 750 > 500
    assert d.state == "rejected" and "voice" in d.reason and "500" in d.reason
    assert admit(voice, [quote], {}).state == "pending"  # no data is never a yes
    other = _task("voice", 500, 1, orch="another-desk")  # other orchestrators do not interfere
    assert admit(other, [quote], {"m": 250.0}).state == "admitted"


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"period_ms": 0}, "period_ms"),
        ({"period_ms": float("nan")}, "period_ms"),
        ({"period_ms": True}, "period_ms"),
        ({"deadline_ms": 600}, "deadline_ms 600 > period_ms 500"),
        ({"priority": 1.5}, "priority"),
        ({"name": "a b"}, "name"),
        ({"model": ""}, "model"),
        ({"orchestrator": "x" * 200}, "orchestrator"),
        ({"evil": 1}, "unknown field"),
        ({"jitter_ms": -1}, "jitter_ms"),
    ],
)
def test_hostile_tasks(patch: dict[str, Any], field: str) -> None:
    base = {"orchestrator": "o", "name": "t", "model": "m", "period_ms": 500, "priority": 0}
    with pytest.raises(ParameterError, match=field):
        AgentTask.from_dict({**base, **patch})


def _registry(*tasks: AgentTask, state: str = "pending") -> dict[bytes, bytes]:
    return {
        t.key.encode(): orjson.dumps({**t.to_dict(), "state": state, "registered_ms": i}) for i, t in enumerate(tasks)
    }


def _apply(reg: dict[bytes, bytes], writes: dict[str, bytes]) -> None:
    reg.update({k.encode(): v for k, v in writes.items()})


def _states(reg: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): orjson.loads(v)["state"] for k, v in reg.items()}


def test_driver_decides_then_warns_when_latency_drifts_and_recovers() -> None:
    drv = AdmissionDriver(10.0)
    reg = _registry(_task("quote", 300, 0), _task("voice", 500, 1))
    writes, events = drv.review(reg, 1_000)
    _apply(reg, writes)  # no latency measured yet: both stay pending, and say why (once)
    assert _states(reg) == {"desk|quote": "pending", "desk|voice": "pending"} and events == []
    assert "no latency measured yet for m" in orjson.loads(reg[b"desk|quote"])["reason"]
    assert drv.review(reg, 2_000) == ({}, [])
    drv.on_window(_win(0, 120.0))
    drv.on_window(_win(0, 100.0, zone="az-b"))  # the largest zone P99 counts
    writes, events = drv.review(reg, 11_000)
    _apply(reg, writes)
    assert _states(reg) == {"desk|quote": "admitted", "desk|voice": "admitted"}
    assert [e["kind"] for e in events] == ["admission_admitted", "admission_admitted"]
    assert orjson.loads(reg[b"desk|voice"])["response_ms"] == 240.0
    # The tail grows (drift): 260 ms -> voice can miss its 500 ms deadline. Warned once, before any miss.
    drv.on_window(_win(1, 260.0))
    writes, events = drv.review(reg, 21_000)
    _apply(reg, writes)
    assert set(_states(reg).values()) == {"infeasible"}
    assert [e["kind"] for e in events] == ["admission_infeasible"] and "voice" in events[0]["reason"]
    assert drv.review(reg, 22_000) == ({}, [])  # said once, not every second
    drv.on_window(_win(2, 110.0))
    drv.on_window(_win(2, 110.0, zone="az-b"))
    writes, events = drv.review(reg, 31_000)
    _apply(reg, writes)
    assert set(_states(reg).values()) == {"admitted"} and [e["kind"] for e in events] == ["admission_feasible"]


def test_driver_rejects_what_does_not_fit_and_keeps_the_admitted_set() -> None:
    drv = AdmissionDriver(10.0)
    drv.on_window(_win(0, 200.0))
    reg = _registry(_task("quote", 300, 0))
    _apply(reg, drv.review(reg, 1)[0])
    reg.update(_registry(_task("voice", 500, 1)))  # 200 -> 400 -> 600 > 500: does not fit
    writes, events = drv.review(reg, 2)
    _apply(reg, writes)
    assert _states(reg) == {"desk|quote": "admitted", "desk|voice": "rejected"}
    assert events[0]["kind"] == "admission_rejected"


def test_hostile_registry_entries_are_marked_invalid_once() -> None:
    drv = AdmissionDriver(10.0)
    drv.on_window(_win(0, 100.0))
    good = _task("quote", 300, 0)
    reg = {
        **_registry(good),
        b"desk|junk": b"{not json",
        b"desk|list": b"[1, 2]",
        b"desk|wrongkey": orjson.dumps({**_task("other", 300, 0).to_dict(), "state": "pending"}),
        b"desk|badstate": orjson.dumps({**_task("badstate", 300, 0).to_dict(), "state": "owned"}),
    }
    writes, _ = drv.review(reg, 5)
    _apply(reg, writes)
    st = _states(reg)
    assert st["desk|quote"] == "admitted"
    assert {st[k] for k in ("desk|junk", "desk|list", "desk|wrongkey", "desk|badstate")} == {"invalid"}
    assert "not orchestrator|name" in orjson.loads(reg[b"desk|wrongkey"])["reason"]
    assert all(k == "desk|quote" for k in drv.review(reg, 6)[0])  # invalid entries are not re-examined


def test_driver_state_is_bounded() -> None:
    drv = AdmissionDriver(10.0)
    for i in range(5000):
        drv.on_window(_win(0, 100.0, model=f"m{i}"))
    assert len(drv._p99) <= 1024


def test_check_file_offline(tmp_path: Path) -> None:
    tasks = [
        {"orchestrator": "desk", "name": "quote", "model": "m", "period_ms": 300, "priority": 0},
        {"orchestrator": "desk", "name": "voice", "model": "m", "period_ms": 500, "priority": 1},
    ]
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(tasks))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "governor.cli", "admission", "check", "--file", str(path), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    ok = run("--latency-ms", "m=120")
    assert ok.returncode == 0, ok.stderr
    assert "desk: feasible; margin x1.389" in ok.stdout
    bad = run("--latency-ms", "m=250", "--json")
    assert bad.returncode == 1
    assert json.loads(bad.stdout)[0]["feasible"] is False
    assert run("--latency-ms", "m=abc").returncode == 2
    path.write_text(json.dumps([{**tasks[0], "period_ms": -1}]))
    hostile = run("--latency-ms", "m=1")
    assert hostile.returncode == 2 and "[0]: period_ms" in hostile.stderr


def _many(n: int, orchestrators: int, **kw: Any) -> dict[bytes, bytes]:
    """``n`` pending tasks over ``orchestrators``, periods 20-60 s at C = 100 ms: each set feasible."""
    tasks = [_task(f"t{i}", 20_000 + 40 * i, i % 50, orch=f"o{i % orchestrators}", **kw) for i in range(n)]
    return _registry(*tasks)


async def test_a_review_runs_off_the_event_loop_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1,000 registered tasks; the analysis is held (a gate) until the loop has done its own work: had the
    # review run on the loop, nothing else would run until it finished (the gate would never open).
    import asyncio
    import threading

    from streams.admission_review import OffLoopReview

    drv = AdmissionDriver(10.0)
    runner = OffLoopReview()
    drv.on_window(_win(0, 100.0))
    reg = _many(1000, 8)
    gate, entered = threading.Event(), threading.Event()

    def held(*args: Any, **kw: Any) -> Any:
        entered.set()
        assert gate.wait(30), "the event loop never got to run while the review was held"
        return admit(*args, **kw)

    monkeypatch.setattr("loop.admission_driver.admit", held)
    results: list[tuple[dict[str, bytes], list[dict[str, Any]]]] = []

    async def review_round() -> None:
        results.append(await runner.run(drv.review, dict(reg), 1_000, drv.latencies()))

    assert runner.launch(review_round)
    assert not runner.launch(review_round)  # one review at a time
    await asyncio.to_thread(entered.wait, 30)
    drv.on_window(_win(1, 120.0))  # the loop goes on: a window arrives, decisions would be published
    gate.set()
    for _ in range(600):
        if results:
            break
        await asyncio.sleep(0.05)
    writes, events = results[0]
    _apply(reg, writes)
    assert set(_states(reg).values()) == {"admitted"} and len(events) == 1000
    assert runner.launch(review_round)  # the next one may start


def test_review_bounds_its_work_and_resumes_where_it_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    import loop.admission_driver as ad

    drv = AdmissionDriver(10.0)
    drv.on_window(_win(0, 100.0))
    reg = _many(240, 4)  # 4 orchestrators x 60 tasks
    # About one orchestrator's worth per review (each call fits in a review: every review makes progress).
    monkeypatch.setattr(ad, "REVIEW_TERMS", 60_000)
    monkeypatch.setattr(ad, "CALL_TERMS", 60_000)
    rounds = 0
    while "pending" in _states(reg).values():
        rounds += 1
        assert rounds < 40, _states(reg)
        _apply(reg, drv.review(reg, rounds)[0])
    assert rounds > 1 and set(_states(reg).values()) == {"admitted"}  # every task decided, over several reviews


def test_a_set_too_costly_to_analyse_is_a_clear_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    import loop.admission_driver as ad

    drv = AdmissionDriver(10.0)
    drv.on_window(_win(0, 100.0))
    monkeypatch.setattr(ad, "CALL_TERMS", 50)
    reg = _many(30, 1)
    _apply(reg, drv.review(reg, 1)[0])
    st = _states(reg)
    assert "rejected" in st.values() and "pending" not in st.values()
    why = {orjson.loads(v)["reason"] for v in reg.values() if orjson.loads(v)["state"] == "rejected"}
    assert all("too costly to analyse" in r for r in why), why


def test_an_orchestrator_runs_at_most_its_cap() -> None:
    from controllers.admission import MAX_TASKS_PER_ORCHESTRATOR as CAP

    drv = AdmissionDriver(10.0)
    drv.on_window(_win(0, 1.0))
    reg = _registry(*(_task(f"t{i}", 80_000 + i, i) for i in range(CAP + 3)))
    _apply(reg, drv.review(reg, 1)[0])
    st = _states(reg)
    assert sum(v == "admitted" for v in st.values()) == CAP
    late = [orjson.loads(reg[f"desk|t{i}".encode()])["reason"] for i in range(CAP, CAP + 3)]
    assert all(f"the most one orchestrator may run ({CAP})" in r for r in late), late
    # Entries written as admitted by hand past the cap: the earliest registered stay admitted.
    forged = _registry(*(_task(f"f{i}", 80_000 + i, i) for i in range(CAP + 2)), state="admitted")
    _apply(forged, drv.review(forged, 2)[0])
    assert sorted(_states(forged).values()).count("rejected") == 2
    with pytest.raises(ParameterError, match=f"more than the {CAP}"):
        evaluate([_task(f"t{i}", 80_000, i) for i in range(CAP + 1)], {"m": 1.0})


def test_registry_parsing_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import loop.admission_driver as ad

    drv = AdmissionDriver(10.0)
    drv.on_window(_win(0, 100.0))
    big = orjson.dumps({**_task("big", 300, 0).to_dict(), "state": "pending", "pad": "x" * 10_000})
    reg = {**_registry(_task("quote", 300, 0)), b"desk|big": big}
    writes, _ = drv.review(reg, 1)
    assert orjson.loads(writes["desk|big"])["reason"] == f"an entry of {len(big)} bytes (at most 4096)"
    assert orjson.loads(writes["desk|quote"])["state"] == "admitted"
    # Past MAX_ENTRIES fields nothing more is read (nor written).
    monkeypatch.setattr(ad, "MAX_ENTRIES", 10)
    many = {f"desk|x{i:03d}".encode(): b"{not json" for i in range(50)}
    assert len(drv.review(many, 2)[0]) == 10


def test_cli_reads_entries_bounded(tmp_path: Path) -> None:
    from controllers.admission import MAX_TASKS_PER_ORCHESTRATOR as CAP
    from governor.admission_cli import _load

    huge = orjson.dumps({"state": "admitted", "pad": "x" * 100_000})
    assert _load(huge) == {"state": "invalid", "reason": f"an entry of {len(huge)} bytes (at most 4096)"}
    assert _load(orjson.dumps({"state": "pending"})) == {"state": "pending"}
    # Offline, one orchestrator's set past the cap is refused with the reason, not analysed.
    tasks = [
        {"orchestrator": "desk", "name": f"t{i}", "model": "m", "period_ms": 9e4, "priority": i} for i in range(CAP + 1)
    ]
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(tasks))
    cmd = [sys.executable, "-m", "governor.cli", "admission", "check", "--file", str(path), "--latency-ms", "m=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"more than the {CAP} one may run" in out.stderr, out.stderr


def test_a_review_never_writes_over_an_entry_changed_while_it_ran() -> None:
    from loop.admission_driver import still_current

    drv = AdmissionDriver(10.0)
    drv.on_window(_win(0, 100.0))
    read = _registry(_task("quote", 300, 0), _task("voice", 500, 1), _task("bulk", 250, 2))
    writes, _ = drv.review(read, 1)
    assert set(writes) == {"desk|quote", "desk|voice", "desk|bulk"}
    now = dict(read)
    del now[b"desk|bulk"]  # removed meanwhile: not brought back
    now[b"desk|voice"] = orjson.dumps({**_task("voice", 900, 1).to_dict(), "state": "pending"})  # re-registered
    assert set(still_current(writes, read, now)) == {"desk|quote"}
