"""Commands: HLC stamps (not part of the id), encode/decode, the stale-by-HLC rule."""

from __future__ import annotations

import orjson
import pytest

from controllers.hlc import Hlc
from streams.commands import Command, CommandError, hlc_stale


def _cmd(**kw) -> Command:  # type: ignore[no-untyped-def]
    base = dict(
        kind="scale",
        zone="az-a",
        model="m",
        target_replicas=4,
        reason="t",
        issued_at_ms=1_000,
        expires_at_ms=61_000,
        basis_ms=900,
    )
    base.update(kw)
    return Command(**base)


def test_hlc_stamp_keeps_command_id() -> None:
    cmd = _cmd()
    stamped = cmd.with_hlc(Hlc(1_234, 7).encode())
    assert stamped.command_id == cmd.command_id
    assert stamped.hlc == (1_234 << 16) | 7 and cmd.hlc == 0
    # A command built from scratch with a stamp gets the same id as without one.
    assert _cmd(hlc=99).command_id == cmd.command_id


def test_encode_decode_round_trip_with_hlc() -> None:
    stamped = _cmd(detail={"apply_at_ms": 5_000}).with_hlc(Hlc(10, 2).encode())
    back = Command.decode(stamped.encode())
    assert back == stamped
    assert Hlc.decode(back.hlc) == Hlc(10, 2)


def test_older_producer_without_hlc_decodes_unstamped() -> None:
    obj = orjson.loads(_cmd().encode())
    del obj["hlc"]
    assert Command.decode(orjson.dumps(obj)).hlc == 0


@pytest.mark.parametrize("bad", [-1, "5", 1.5, True])
def test_bad_hlc_is_rejected(bad: object) -> None:
    with pytest.raises(CommandError, match="hlc"):
        _cmd(hlc=bad)


def test_hlc_stale_rule() -> None:
    older, newer = Hlc(100, 0).encode(), Hlc(100, 1).encode()
    assert hlc_stale(older, newer)
    assert not hlc_stale(newer, older)
    assert not hlc_stale(newer, newer)  # equal is not older
    assert not hlc_stale(older, None)  # nothing applied yet
    assert not hlc_stale(0, newer)  # unstamped (older producer): skip the check


def test_order_field_is_kind_and_model() -> None:
    assert _cmd().order_field == "scale:m"
