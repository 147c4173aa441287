"""Command signatures (core.signing), the keys' settings, and the executor's guard (executors.guard)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from controllers.hlc import Hlc
from core.settings import ModelSpec, Settings, SettingsError
from core.signing import Keyring, canonical_bytes, generate_keys
from executors.guard import CommandGuard
from governor.cli import main
from loop.commands import COMMAND_KINDS, Command
from tests.unit.test_command_payloads import cmd_of, make_cmd

OLD_HEX, NEW_HEX = bytes(range(32)).hex(), bytes(range(32, 64)).hex()  # fixed, not uniform: weak keys are refused
OLD = "old:" + OLD_HEX
NEW = "new:" + NEW_HEX


def _signed(ring: Keyring, **changes: Any) -> Command:
    c = make_cmd(detail={"apply_at_ms": 5_000}, **changes).with_hlc(Hlc(10, 2).encode())
    return c.signed(ring)


def _verify(ring: Keyring, raw: bytes | dict[str, Any]) -> str | None:
    """What an executor does: decode the entry, verify the decoded command."""
    return ring.verify(asdict(Command.decode(raw)))


def test_sign_then_verify_through_the_wire() -> None:
    ring = Keyring.parse(NEW)
    c = _signed(ring)
    assert c.key_id == "new" and len(c.signature) == 64
    assert _verify(ring, c.encode()) is None
    # key_id and signature are not part of command_id
    assert c.command_id == make_cmd().command_id


def test_rotation_old_key_still_verifies_new_key_signs() -> None:
    old_ring, rotated = Keyring.parse(OLD), Keyring.parse(f"{NEW},{OLD}")
    assert rotated.active == "new" and rotated.key_ids == ("new", "old")
    in_flight = _signed(old_ring)  # signed before the rotation reached the worker
    assert _verify(rotated, in_flight.encode()) is None
    fresh = _signed(rotated)
    assert fresh.key_id == "new" and _verify(rotated, fresh.encode()) is None
    # Once the old key is dropped, what it signed is refused.
    assert _verify(Keyring.parse(NEW), in_flight.encode()) == "unknown key id 'old'"


def test_unsigned_and_unknown_key_ids_are_refused() -> None:
    ring = Keyring.parse(NEW)
    assert _verify(ring, make_cmd().encode()) == "unsigned command"
    other = _signed(Keyring.parse(OLD))
    assert _verify(ring, other.encode()) == "unknown key id 'old'"
    same_kid_other_key = _signed(Keyring.parse("new:" + bytes(range(64, 96)).hex()))
    assert _verify(ring, same_kid_other_key.encode()) == "bad signature (key id new)"


TAMPER: dict[str, Any] = {
    "zone": "az-b",
    "model": "m2",
    "target_replicas": 40,
    "previous_replicas": 1,
    "reason": "forged",
    "issued_at_ms": 1,
    "expires_at_ms": 10**12,
    "basis_ms": 2**40,
    "controller": "fpid",
    "detail": {"apply_at_ms": 9_999_999},
    "command_id": "scale-00000000000000000000",
    "hlc": Hlc(10, 3).encode(),
}


@pytest.mark.parametrize(("name", "value"), sorted(TAMPER.items()))
def test_tampering_with_any_field_breaks_the_signature(name: str, value: Any) -> None:
    ring = Keyring.parse(NEW)
    obj = orjson.loads(_signed(ring).encode())
    assert obj[name] != value
    obj[name] = value
    assert _verify(ring, obj) == "bad signature (key id new)"


def test_hlc_and_apply_at_are_covered_and_every_field_but_the_signature_is_signed() -> None:
    c = asdict(_signed(Keyring.parse(NEW)))
    body = orjson.loads(canonical_bytes(c))
    assert body["hlc"] == Hlc(10, 2).encode() and body["detail"] == {"apply_at_ms": 5_000}
    assert set(body) == set(c) - {"key_id", "signature"}
    # Re-stamping (what a re-delivered decision gets) drops the old signature: the bridge re-signs.
    restamped = Command.decode(orjson.dumps(c)).with_hlc(Hlc(11, 0).encode())
    assert restamped.signature == "" and restamped.key_id == ""


@pytest.mark.parametrize("kind", sorted(COMMAND_KINDS))
def test_every_kind_signs_and_verifies(kind: str) -> None:
    ring = Keyring.parse(NEW)
    c = cmd_of(kind).with_hlc(Hlc(10, 0).encode()).signed(ring)
    assert _verify(ring, c.encode()) is None
    obj = orjson.loads(c.encode())
    if obj["payload"]:  # any payload change breaks it too
        obj["payload"] = {**obj["payload"], "extra": 1}
        with pytest.raises(ValueError):
            _verify(ring, obj)  # unknown payload key: not even decodable


# -- the keys' settings ------------------------------------------------------------------------------------------------
def test_keys_come_from_the_setting_and_never_print() -> None:
    s = Settings.from_env({"GOVERNOR_COMMAND_KEYS": f"{NEW}, {OLD}"})
    ring = s.keyring()
    assert ring is not None and ring.key_ids == ("new", "old")
    assert NEW_HEX not in repr(s) and NEW_HEX not in repr(ring)
    assert Settings.from_env(s.to_env()) == s
    assert Settings().keyring() is None


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("k:abcd", "must be at least 32 bytes (got 2)"),
        ("k:" + "zz" * 32, "not hexadecimal"),
        ("nokey", "kid:hexkey"),
        (f"{NEW},{NEW}", "appears twice"),
        # Issue 31, item 2: keys that are public or not random, in any position of the ring.
        ("REPLACE-ME:" + "00" * 32, "key id 'REPLACE-ME' is marked as a placeholder ('replaceme')"),
        (f"{NEW},change-me:{OLD_HEX}", "key id 'change-me' is marked as a placeholder ('changeme')"),
        ("k1:ChangeMe", "key 'k1': its value is marked as a placeholder ('changeme')"),
        ("Example_Key:" + NEW_HEX, "placeholder ('example')"),
        ("k1:" + "00" * 32, "key 'k1': its bytes are all one value"),
        (f"{NEW},k2:" + "ff" * 64, "key 'k2': its bytes are all one value"),
        ("k1:" + "deadbeef" * 8, "key 'k1': its bytes take only 4 distinct values (fewer than 8)"),
    ],
)
def test_a_bad_key_is_a_settings_error_naming_the_variable_not_the_key(raw: str, why: str) -> None:
    with pytest.raises(SettingsError, match="GOVERNOR_COMMAND_KEYS") as err:
        Settings.from_env({"GOVERNOR_COMMAND_KEYS": raw})
    assert why in str(err.value)
    assert NEW_HEX not in str(err.value) and "zz" * 32 not in str(err.value)


def test_the_keys_file_wins(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# rotated 2026-12-01\n{NEW}\n{OLD}\n")
    s = Settings.from_env(
        {"GOVERNOR_COMMAND_KEYS": "other:" + bytes(range(96, 128)).hex(), "GOVERNOR_COMMAND_KEYS_FILE": str(path)}
    )
    ring = s.keyring()
    assert ring is not None and ring.key_ids == ("new", "old")
    path.write_text("short:abcd\n")
    with pytest.raises(SettingsError, match="GOVERNOR_COMMAND_KEYS_FILE=.*at least 32 bytes"):
        Settings.from_env({"GOVERNOR_COMMAND_KEYS_FILE": str(path)})
    with pytest.raises(SettingsError, match="GOVERNOR_COMMAND_KEYS_FILE"):
        Settings.from_env({"GOVERNOR_COMMAND_KEYS_FILE": str(tmp_path / "missing")})


def test_generated_keys_are_valid_and_random() -> None:
    a, b = Keyring.parse(generate_keys()), Keyring.parse(generate_keys())
    assert a.active != b.active and len(next(iter(a.keys.values()))) == 32


@pytest.mark.parametrize("argv", [["worker"], ["executor", "--zone", "az-a"]])
def test_worker_and_executor_refuse_to_start_without_a_key(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GOVERNOR_COMMAND_KEYS", raising=False)
    monkeypatch.delenv("GOVERNOR_COMMAND_KEYS_FILE", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GOVERNOR_COMMAND_KEYS" in err[0]


# -- the executor's guard ------------------------------------------------------------------------------------------
RING = Keyring.parse(NEW)
GUARD = CommandGuard.from_settings(
    Settings(
        models=(ModelSpec("m", max_replicas=8), ModelSpec("llama2-70b"), ModelSpec("m@v2")),
        zones=("az-a", "az-b"),
        fallbacks=(("chat", "m"),),
    ),
    RING,
)


def _check(c: Command, version: int = 2, now_ms: int = 1_000) -> str | None:
    return GUARD.check(Command.decode(c.signed(RING).encode()), version, now_ms)


def test_the_guard_admits_known_targets_of_every_kind() -> None:
    for kind in sorted(COMMAND_KINDS):
        c = cmd_of(kind)
        if kind == "canary":
            c = cmd_of(kind, payload={**c.payload, "version": "v2"})
        assert _check(c) is None, kind


@pytest.mark.parametrize(
    ("kind", "model", "payload", "why"),
    [
        ("scale", "gpt", None, "unknown model 'gpt'"),
        ("relocate", "gpt", None, "unknown model 'gpt'"),
        ("agents", "gpt", None, "unknown model 'gpt'"),
        ("route", "nope", None, "unknown route family 'nope'"),
        ("canary", "m", {"model": "m", "version": "v9", "share": 0.1}, "unknown canary model 'm@v9'"),
        ("canary", "gpt", {"model": "gpt", "version": "v2", "share": 0.1}, "unknown model 'gpt'"),
    ],
)
def test_the_guard_refuses_unknown_targets(kind: str, model: str, payload: dict[str, Any] | None, why: str) -> None:
    changes: dict[str, Any] = {"model": model}
    if payload is not None:
        changes["payload"] = payload
    why_not = _check(cmd_of(kind, **changes))
    assert why_not is not None and why_not.startswith(why)


def test_the_guard_checks_breaker_targets_scale_bounds_ttl_and_v1() -> None:
    base = cmd_of("breaker").payload
    for target, why in (("gpt|az-a", "model not in"), ("m|az-z", "zone not in")):
        c = cmd_of("breaker", model=target, payload={**base, "target": target})
        assert why in (_check(c) or "")
    assert "max_replicas 8" in (_check(make_cmd(target_replicas=9)) or "")
    assert "above the command TTL" in (_check(make_cmd(issued_at_ms=0, expires_at_ms=60_001)) or "")
    assert _check(make_cmd(issued_at_ms=0, expires_at_ms=60_000)) is None
    assert "GOVERNOR_ACCEPT_UNSIGNED_V1" in (GUARD.check(make_cmd(), 1, 1_000) or "")
    lenient = dataclasses.replace(GUARD, accept_unsigned_v1=True)
    assert lenient.check(make_cmd(), 1, 1_000) is None


def test_the_guard_refuses_stamps_beyond_the_clock_skew() -> None:
    skew = 30_000  # GOVERNOR_MAX_CLOCK_SKEW_S default, clock speed 1
    assert _check(make_cmd(basis_ms=1_000 + skew)) is None
    assert (_check(make_cmd(basis_ms=1_001 + skew)) or "").startswith("basis_ms ")
    assert (_check(make_cmd().with_hlc(Hlc(1_001 + skew, 0).encode())) or "").startswith("hlc ")
    assert (_check(make_cmd(detail={"apply_at_ms": 1_001 + skew})) or "").startswith("detail.apply_at_ms ")


@pytest.mark.parametrize(
    ("issued_at_ms", "refused"),
    [
        (1_000 + 30_000, False),  # exactly the skew ahead: admitted
        (1_001 + 30_000, True),  # one ms beyond it
        (1_000 + 10 * 365 * 86_400_000, True),  # ten years ahead, basis and hlc ordinary (issue 31, item 7)
    ],
)
def test_the_guard_refuses_an_issued_at_beyond_the_clock_skew(issued_at_ms: int, refused: bool) -> None:
    why = _check(make_cmd(issued_at_ms=issued_at_ms, expires_at_ms=issued_at_ms + 60_000))
    if refused:
        assert (why or "").startswith("issued_at_ms ") and "GOVERNOR_MAX_CLOCK_SKEW_S=30" in (why or ""), why
    else:
        assert why is None
