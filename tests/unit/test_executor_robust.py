"""No stream entry stops an executor: the pure checks of :mod:`executors.entry`, then a hypothesis
property test that feeds arbitrary entries to :meth:`ZoneExecutor.handle` on the real Redis of the
``settings`` fixture (no mock) and counts the exceptions that escape: there must be none, every
entry must end as exactly one result (capped) and the staleness hashes must hold only ints."""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from core import names
from core.clock import ScaledClock
from core.settings import Settings
from executors.backends import DryRunBackend
from executors.entry import ECHO_CAP, MAX_DEPTH, RESULT_CAP, decode_entry, echo, encode_result, stored_int
from executors.executor import ZoneExecutor
from executors.timing import Held
from loop.commands import Command, CommandError
from tests.integration.harness import guard, sign

MODEL = "m"


def _scale(target: int = 2, *, basis_ms: int | None = None, **kw: Any) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind="scale",
        zone="az-a",
        model=MODEL,
        target_replicas=target,
        reason="fuzz",
        issued_at_ms=now,
        expires_at_ms=now + 30_000,
        basis_ms=now if basis_ms is None else basis_ms,
        **kw,
    )


def _nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


# -- pure checks ---------------------------------------------------------------------------------


def test_deep_detail_is_a_command_error_not_a_recursion_error() -> None:
    raw = _scale().encode()
    for depth in (MAX_DEPTH + 1, 300, 600, 1000):
        entry = {b"cmd": raw.replace(b'"detail":{}', b'"detail":' + _nested(depth))}
        with pytest.raises(CommandError, match="nested deeper"):
            decode_entry(entry)
    obj, cmd = decode_entry({b"cmd": raw.replace(b'"detail":{}', b'"detail":' + _nested(MAX_DEPTH - 1))})
    assert cmd.command_id and obj["schema_version"] == 2


@pytest.mark.parametrize("fields", [None, {}, {b"cmd": b"[1]"}, {b"cmd": b"NaN"}, {b"cmd": b"\xff"}, {b"x": b"1"}])
def test_malformed_fields_are_command_errors(fields: Any) -> None:
    with pytest.raises(CommandError):
        decode_entry(fields)


def test_only_64_bit_decimal_ints_are_believed_from_the_staleness_hashes() -> None:
    assert [stored_int(v) for v in (b"12", b"-4", b"18446744073709551615")] == [12, -4, 2**64 - 1]
    for bad in (b"1.5", b"1e3", b"nan", b"inf", b"", b" 1", b"99999999999999999999999", b"0x10", None, 3):
        assert stored_int(bad) is None, bad


def test_echo_and_results_are_capped() -> None:
    big = b"x" * (2 * 1024 * 1024)
    text = echo(big)
    assert len(text.encode()) < ECHO_CAP + 64 and text.endswith(f"...[truncated {len(big) - ECHO_CAP} bytes]")
    out = encode_result({"outcome": "rejected", "reason": "r" * 10, "detail": {"raw": big.decode()}})
    assert len(out) <= RESULT_CAP and orjson.loads(out)["detail"]["truncated"] is True
    # Unencodable (an int above 64 bits, a NaN-free but odd object): still one small record.
    odd = orjson.loads(encode_result({"outcome": "failed", "detail": {"n": 2**80}, "reason": "x" * 5_000_000}))
    assert odd["outcome"] == "failed" and odd["detail"]["truncated"] is True and len(odd["reason"]) < 2_000


def test_a_hold_is_due_at_its_target_or_its_wall_bound_whichever_comes_first() -> None:
    far = 1e18  # an apply_at_ms 31 million years ahead
    held = Held(b"1-1", {}, _scale(), target_ms=far, until_s=100.0)
    assert not held.due(0.0, 99.9) and held.due(0.0, 100.0) and held.due(far, 0.0)
    assert held.wait_s(0.0, lambda ms: ms / 1000, 99.0) == 1.0  # the wall bound, not 31 million years
    assert Held(b"1-1", {}, _scale(), target_ms=5.0, until_s=100.0).wait_s(10.0, lambda ms: ms / 1000, 0.0) == 0.0


# -- the property test ----------------------------------------------------------------------------


def _json(v: Any) -> bytes:
    """JSON text of ``v`` with what orjson will not write: NaN/Infinity literals, ints beyond 64 bits."""
    if isinstance(v, float) and not math.isfinite(v):
        return b"NaN" if math.isnan(v) else (b"Infinity" if v > 0 else b"-Infinity")
    if isinstance(v, bool) or v is None or isinstance(v, str | float):
        return orjson.dumps(v)
    if isinstance(v, int):
        return str(v).encode()
    if isinstance(v, list):
        return b"[" + b",".join(_json(x) for x in v) + b"]"
    return b"{" + b",".join(orjson.dumps(str(k)) + b":" + _json(x) for k, x in v.items()) + b"}"


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["scale", "route", "breaker", "az-a", MODEL, f"{MODEL}|az-a", "", "|"])
)
VALUES = st.recursive(
    SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3), max_leaves=8
)
FIELDS = list(_scale().__dataclass_fields__)


@st.composite
def entries(draw: st.DrawFn) -> tuple[Any, int]:
    """Entry fields (as redis-py returns them) and a delivery count."""
    kind = draw(st.sampled_from(["bytes", "json", "mutated", "mutated", "mutated", "deep", "huge", "fields"]))
    deliveries = draw(st.integers(min_value=1, max_value=8))
    now = int(time.time() * 1000)
    if kind == "bytes":
        return {b"cmd": draw(st.binary(max_size=300))}, deliveries
    if kind == "json":
        return {b"cmd": _json(draw(VALUES))}, deliveries
    if kind == "fields":
        return draw(st.none() | st.dictionaries(st.binary(max_size=8), st.binary(max_size=30), max_size=3)), deliveries
    base = orjson.loads(_scale(draw(st.integers(0, 70)), basis_ms=now - draw(st.integers(-5, 5_000))).encode())
    if kind == "deep":
        depth = draw(st.integers(min_value=0, max_value=1100))
        raw = orjson.dumps(base).replace(b'"detail":{}', b'"detail":' + _nested(depth))
        return {b"cmd": raw}, deliveries
    if kind == "huge":
        base["reason"] = "x" * draw(st.integers(min_value=1 << 20, max_value=(1 << 20) + 5000))
        return {b"cmd": orjson.dumps(base)}, deliveries
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 4]))):
        name = draw(st.sampled_from([*FIELDS, "extra"]))
        if draw(st.booleans()) and name in base:
            del base[name]
        else:
            base[name] = draw(
                VALUES
                | st.builds(lambda d: {"apply_at_ms": now + d}, st.integers(-1000, 60))
                | st.builds(lambda d: {"apply_at_ms": d}, st.floats(allow_nan=True, allow_infinity=True))
            )
    raw = _json(base)
    if draw(st.booleans()):  # signed: a valid command reaches the backend, an invalid one the decoder
        try:
            raw = sign(SIGNER, Command.decode(base)).encode()
        except (CommandError, ValueError, TypeError):
            pass
    extra = {b"bridged_ms": _json(draw(SCALARS))} if draw(st.booleans()) else {}
    return {b"cmd": raw, **extra}, deliveries


SIGNER: Settings  # set by the test (the suite's signing key)


async def _release(ex: ZoneExecutor) -> int:
    await asyncio.sleep(0.005)
    return await ex.release_due()


class _Results:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.sent.append(value)


def test_no_entry_escapes_handle(settings: Settings) -> None:
    global SIGNER
    SIGNER = settings
    loop = asyncio.new_event_loop()
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    results = _Results()
    ex = ZoneExecutor(
        zone="az-a",
        prefix=settings.topic_prefix,
        redis=redis,
        backend=DryRunBackend(),
        guard=guard(settings.replace(max_clock_skew_s=0.05), MODEL),  # apply_at holds <= 50 ms
        clock=ScaledClock(),
        results=results,
        results_topic="r",
        block_ms=1,
        probe_interval_s=0,
        max_deliveries=5,
    )
    basis_key = names.executor_last_basis(settings.topic_prefix, "az-a")
    # What an older executor may have left: values that are not ints count as absent.
    loop.run_until_complete(redis.hset(basis_key, mapping={MODEL: b"1712.5", "route:m": b"nan", "x": b"abc"}))
    stats = {"examples": 0, "escaped": 0, "applied": 0, "internal": 0}

    @hsettings(
        max_examples=int(os.environ.get("FUZZ_EXAMPLES", "400")),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(entry=entries())
    def one(entry: tuple[Any, int]) -> None:
        fields, deliveries = entry
        before = len(results.sent)
        stats["examples"] += 1
        try:
            done = loop.run_until_complete(ex.handle(b"1-1", fields, deliveries))
            while done == 0 and ex.held:  # held for its apply_at_ms (at most 50 ms here)
                done = loop.run_until_complete(_release(ex))
        except BaseException:
            stats["escaped"] += 1
            raise
        assert done == 1 and len(results.sent) == before + 1
        record = orjson.loads(results.sent[-1])
        assert len(results.sent[-1]) <= RESULT_CAP
        stats["applied"] += record["outcome"] == "applied"
        stats["internal"] += record["reason"].startswith("internal error")
        if deliveries > 5:
            assert record["outcome"] == "failed" and record["reason"] == "delivery limit"

    t0 = time.monotonic()
    try:
        one()
        stored = loop.run_until_complete(redis.hgetall(basis_key))
        stored |= loop.run_until_complete(redis.hgetall(names.executor_last_hlc(settings.topic_prefix, "az-a")))
    finally:
        loop.run_until_complete(redis.aclose())
        loop.close()
    print(f"fuzz: {stats} in {time.monotonic() - t0:.1f} s")
    assert stats["escaped"] == 0 and stats["examples"] >= 100
    assert stats["internal"] == 0, "an entry reached the catch-all: a check is missing before it"
    assert stats["applied"] > 0, "no example reached the backend"
    assert stored[MODEL.encode()] != b"1712.5", "a scale applied over the stored non-int basis"
    assert all(stored_int(v) is not None for k, v in stored.items() if k not in (b"route:m", b"x")), stored
