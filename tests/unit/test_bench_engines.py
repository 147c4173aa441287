"""``governor bench engines``: the pure parts -- CPU accounting from /proc, the table -- without engines.

The real-engine run is the command itself (its table is in docs/benchmarks.md); the engine pool and
router have their own real-engine tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.engines import (
    CLK_TCK,
    CpuSample,
    cpu_sample,
    cpu_shares,
    group_cpu_s,
    group_pids,
    itl_basis,
    machine_cpu_s,
    markdown,
    parse_ints,
    process_cpu_s,
    summarize,
    trials_text,
)
from engines.profiling import CapacityProfile, Unloaded, slos_from

# A child that spins, and starts a grandchild that spins too: one process group of two busy processes.
SPIN = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'while True: pass']); exec('while True: pass')"


@pytest.fixture
def spinning_group():  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _until(cond, what: str, limit_s: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit_s  # a bound on waiting, not an assertion on time
    while not (value := cond()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return value


def test_a_busy_process_group_is_counted_whole_and_alone(spinning_group: subprocess.Popen[bytes]) -> None:
    pgid = spinning_group.pid
    pids = _until(lambda: p if len(p := group_pids(pgid)) == 2 else None, "the grandchild never started")
    assert pgid in pids and os.getpid() not in pids
    _until(lambda: all((process_cpu_s(p) or 0.0) >= 0.2 for p in pids), "the group never used CPU")
    before = cpu_sample({"spin": pgid})
    _until(lambda: group_cpu_s(pgid) >= before.groups["spin"] + 0.3, "no CPU between the samples")
    after = cpu_sample({"spin": pgid})
    # the group's seconds are its processes' seconds, read from /proc/<pid>/stat
    assert before.groups["spin"] >= sum(process_cpu_s(p) or 0.0 for p in pids) - 0.5
    shares = cpu_shares(before, after)
    assert shares["groups"]["spin"] > 0.0
    # shares of one machine: the named groups, this process, the others and the idle time make up all of it
    total = shares["groups"]["spin"] + shares["client"] + shares["other"] + shares["idle"]
    assert total == pytest.approx(1.0, abs=0.05)
    # this process only waited: it is counted as the client, never in the group
    assert shares["client"] < shares["groups"]["spin"]


def test_a_process_gone_has_no_seconds_and_leaves_its_group(spinning_group: subprocess.Popen[bytes]) -> None:
    pgid = spinning_group.pid
    _until(lambda: len(group_pids(pgid)) == 2, "the grandchild never started")
    os.killpg(pgid, signal.SIGKILL)
    spinning_group.wait(10)
    assert process_cpu_s(spinning_group.pid) is None
    _until(lambda: not group_pids(pgid), "the killed group is still listed")  # the grandchild is reaped by init
    assert group_cpu_s(pgid) == 0.0


def _fake_proc(tmp_path: Path) -> Path:
    """A /proc with three processes (one a zombie, one named with a parenthesis and spaces) and a stat line."""

    def stat(pid: int, comm: str, state: str, pgrp: int, utime: int, stime: int) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        rest = [state, "1", str(pgrp), "0", "0", "0", "0", "0", "0", "0", "0", str(utime), str(stime), "0", "0"]
        (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(rest) + "\n")

    stat(10, "VLLM::Worker", "R", 10, 3 * CLK_TCK, CLK_TCK)
    stat(11, "py) (x y", "S", 10, CLK_TCK, 0)  # a name that would break a naive split
    stat(12, "gone", "Z", 10, 50 * CLK_TCK, 0)  # a zombie: no longer a member
    stat(20, "vllm::router", "S", 20, 0, CLK_TCK // 2)
    (tmp_path / "self").mkdir()
    (tmp_path / "stat").write_text(f"cpu  {4 * CLK_TCK} 0 {CLK_TCK} {5 * CLK_TCK} {CLK_TCK} 0 0 0 0 0\ncpu0 1 2 3\n")
    return tmp_path


def test_proc_fields_are_read_past_the_command_name(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path)
    assert group_pids(10, proc) == [10, 11]
    assert process_cpu_s(10, proc) == 4.0 and process_cpu_s(11, proc) == 1.0
    assert group_cpu_s(10, proc) == 5.0
    assert group_cpu_s(20, proc) == 0.5
    assert process_cpu_s(99, proc) is None
    assert machine_cpu_s(proc) == (5.0, 11.0)  # busy: all but idle and iowait


def test_shares_refuse_an_empty_interval() -> None:
    s = CpuSample(0.0, {}, 0.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="no machine time"):
        cpu_shares(s, s)


def _row(engines: int, capacity: float, trials: list[dict[str, object]]) -> dict[str, object]:
    shares = {"wall_s": 60.0, "groups": {"e1": 0.48, "e2": 0.3, "router": 0.02}, "client": 0.12, "other": 0.05,
              "idle": 0.03}  # fmt: skip
    return summarize(engines, 4, CapacityProfile(capacity, 0.95, trials), shares, ["e1", "e2"][:engines])


def test_the_table_has_one_row_per_size_with_the_trial_at_the_capacity() -> None:
    ok = {"attainment": 0.97, "p95_ttft_ms": 31.4, "output_tokens": 3200, "duration_s": 10.5, "passed": True}
    one = _row(1, 8.0, [{**ok, "rate_rps": 1.0}, {**ok, "rate_rps": 8.0},
                        {"rate_rps": 11.3, "attainment": 0.5, "p95_ttft_ms": 900.0, "passed": False}])  # fmt: skip
    one["ratio"] = 1.0
    two = _row(2, 0.0, [{"rate_rps": 1.0, "attainment": 0.2, "p95_ttft_ms": None, "passed": False}])
    assert one["tokens_per_s"] == pytest.approx(304.8)
    assert one["at_capacity"] == {"attainment": 0.97, "p95_ttft_ms": 31.4}
    assert two["at_capacity"] is None and two["tokens_per_s"] is None
    text = markdown({"command": "governor bench engines --sizes 1,2", "slo": {"ttft_slo_ms": 40.0, "itl_slo_ms": 9.0}},
                    [one, two])  # fmt: skip
    lines = text.splitlines()
    assert lines[0] == "`governor bench engines --sizes 1,2` (SLO: TTFT 40 ms, ITL 9 ms)"
    assert lines[4] == "| 1 | yes | 4 | 8.00 | 1.00 | 305 | 97.0 %, 31 ms | 48 % | 2 % | 12 % | 5 % | 3 % |"
    assert lines[5] == "| 2 | yes | 4 | 0.00 | - | - | - | 48 % + 30 % | 2 % | 12 % | 5 % | 3 % |"
    assert len({line.count("|") for line in lines[2:]}) == 1  # every row has the header's columns
    assert trials_text([one]).endswith(
        "1 req/s 97.0 % 31 ms ok; 8 req/s 97.0 % 31 ms ok; 11.3 req/s 50.0 % 900 ms miss"
    )


def test_the_itl_slo_holds_when_the_client_gets_tokens_in_bursts() -> None:
    # unloaded through the router: tokens in one burst (ITL 10 us), 73 ms for 32 tokens end to end
    burst = Unloaded(n=20, ttft_p50_s=0.068, ttft_p95_s=0.09, itl_p50_s=1e-05, itl_p95_s=1e-05, e2e_mean_s=0.0728)
    assert slos_from(burst, 5.0)[1] == 1.0  # the raw basis: the 1 ms floor, which a real 1.5 ms token misses
    ttft, itl = slos_from(itl_basis(burst, 32), 5.0)
    assert (ttft, itl) == (450.0, 11.4)  # TTFT untouched; ITL 5 x 73 ms / 32
    streamed = Unloaded(n=20, ttft_p50_s=0.01, ttft_p95_s=0.012, itl_p50_s=0.004, itl_p95_s=0.006, e2e_mean_s=0.13)
    assert itl_basis(streamed, 32) == streamed  # a measured ITL above the per-token time is kept


@pytest.mark.parametrize("text", ["", "a", "0", "2,1", "1,1", "1,9"])
def test_unusable_lists_are_refused_naming_the_option(text: str) -> None:
    with pytest.raises(SystemExit, match="--sizes"):
        parse_ints(text, "--sizes", 1, 8)


def test_the_command_is_registered_with_its_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "governor.cli", "bench", "engines", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for option in ("--max-num-seqs", "--sizes", "--slo-multiple", "--trial-s", "--steps", "--json"):
        assert option in out
