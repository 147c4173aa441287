"""Commands: ids, schema v2 and the v1 records still accepted (converted, keeping their ids),
top-level fields, decode on arbitrary JSON, HLC stamps, the stale-by-HLC rule.  The payload
and target tables per kind are in tests/unit/test_command_payloads.py."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers.hlc import Hlc
from loop.command_payloads import BreakerPayload
from loop.commands import (
    COMMAND_KINDS,
    COMMAND_SCHEMA_VERSION,
    Command,
    CommandError,
    command_id,
    command_id_v1,
    hlc_stale,
)
from tests.unit.test_command_payloads import VALID, cmd_of, make_cmd


# -- ids ------------------------------------------------------------------------------------------------------------
def test_the_v2_id_rule() -> None:
    c = make_cmd(target_replicas=4, previous_replicas=2)
    basis = 'v2|scale|az-a|m|900|{"target_replicas":4}'
    assert c.command_id == "scale-" + hashlib.sha256(basis.encode()).hexdigest()[:20]
    r = cmd_of("breaker")
    canonical = orjson.dumps(r.payload, option=orjson.OPT_SORT_KEYS).decode()
    basis = f"v2|breaker|az-a|m|az-b|900|{canonical}"
    assert r.command_id == "breaker-" + hashlib.sha256(basis.encode()).hexdigest()[:20]
    assert command_id("scale", "az-a", "m", 900, {"target_replicas": 4}) == c.command_id


def test_the_same_decision_gets_the_same_id_and_another_decision_another() -> None:
    a = cmd_of("route")
    model, payload = VALID["route"]
    shuffled = {c: dict(reversed(ws.items())) for c, ws in reversed(payload["weights"].items())}
    assert cmd_of("route", payload={**payload, "weights": shuffled}).command_id == a.command_id
    assert cmd_of("route", reason="other", issued_at_ms=5, expires_at_ms=9).command_id == a.command_id
    assert cmd_of("route", basis_ms=901).command_id != a.command_id
    assert cmd_of("route", zone="az-b").command_id != a.command_id
    assert cmd_of("route", payload={"weights": {"*": {"llama2-70b|az-b": 1.0}}}).command_id != a.command_id
    # previous_replicas is context, not decision: it does not change a scale id
    assert (
        make_cmd(previous_replicas=2).command_id
        == make_cmd(previous_replicas=9).command_id
        != make_cmd(target_replicas=5).command_id
    )
    assert all(cmd_of(k).command_id.startswith(f"{k}-") for k in COMMAND_KINDS)


def test_hlc_stamp_keeps_command_id() -> None:
    cmd = make_cmd()
    stamped = cmd.with_hlc(Hlc(1_234, 7).encode())
    assert stamped.command_id == cmd.command_id
    assert stamped.hlc == (1_234 << 16) | 7 and cmd.hlc == 0
    # A command built from scratch with a stamp gets the same id as without one.
    assert make_cmd(hlc=99).command_id == cmd.command_id


# -- schema versions --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(COMMAND_KINDS))
def test_v2_round_trip_is_the_identity(kind: str) -> None:
    c = cmd_of(kind, detail={"apply_at_ms": 5_000}).with_hlc(Hlc(10, 2).encode())
    raw = c.encode()
    back = Command.decode(raw)
    assert back == c and back.encode() == raw and back.typed_payload == c.typed_payload
    assert orjson.loads(raw)["schema_version"] == COMMAND_SCHEMA_VERSION == 2
    assert Command.decode(orjson.loads(raw)) == c  # a dict decodes too


# Records exactly as the schema-v1 code (git: loop/commands.py before v2) encoded them.
V1_BREAKER = (
    b'{"kind":"breaker","zone":"az-a","model":"m|az-b","target_replicas":0,"reason":"trip","issued_at_ms":1000,'
    b'"expires_at_ms":61000,"basis_ms":900,"previous_replicas":null,"controller":"breaker","detail":{},'
    b'"payload":{"target":"m|az-b","state":"open","probe_budget":0,"threshold":0.005,"error_ratio":0.25},'
    b'"schema_version":1,"command_id":"breaker-580885a9b56b73dc77d3","hlc":0}'
)
V1_SCALE = (
    b'{"kind":"scale","zone":"az-a","model":"m","target_replicas":4,"reason":"scale_up","issued_at_ms":1000,'
    b'"expires_at_ms":61000,"basis_ms":900,"previous_replicas":2,"controller":"pid","detail":{},"payload":{},'
    b'"schema_version":1,"command_id":"scale-ee431d0dc601607ba9f3","hlc":0}'
)


def test_a_v1_record_is_converted_and_keeps_its_v1_id() -> None:
    brk = Command.decode(V1_BREAKER)
    assert brk.command_id == "breaker-580885a9b56b73dc77d3"
    assert brk.target_replicas is None and brk.schema_version == 2
    assert brk.typed_payload == BreakerPayload("m|az-b", "open", 0, 0.005, 0.25)
    sc = Command.decode(V1_SCALE)
    assert sc.command_id == "scale-ee431d0dc601607ba9f3"
    assert (sc.target_replicas, sc.previous_replicas) == (4, 2)
    # its v2 encoding (what the bridge writes) keeps the v1 id and round-trips
    for c in (brk, sc):
        assert Command.decode(c.encode()) == c
        assert Command.decode(c.with_hlc(7).encode()).command_id == c.command_id
    # the v1 ids differ from the ids the same decisions get in v2
    assert make_cmd(target_replicas=4, previous_replicas=2).command_id != sc.command_id


def test_the_v1_id_rule_is_the_old_one() -> None:
    assert command_id_v1("scale", "az-a", "m", 900, 4) == "scale-ee431d0dc601607ba9f3"
    p = orjson.loads(V1_BREAKER)["payload"]
    assert command_id_v1("breaker", "az-a", "m|az-b", 900, 0, p) == "breaker-580885a9b56b73dc77d3"


@pytest.mark.parametrize("raw", [V1_BREAKER, V1_SCALE])
def test_a_v1_record_without_an_id_gets_its_v1_id(raw: bytes) -> None:
    obj = orjson.loads(raw)
    want = obj.pop("command_id")
    del obj["hlc"]  # older v1 producers had no hlc either
    c = Command.decode(orjson.dumps(obj))
    assert c.command_id == want and c.hlc == 0


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"target_replicas": -1}, "target_replicas"),
        ({"target_replicas": None}, "target_replicas"),
        ({"kind": "reboot"}, "kind"),
        ({"payload": {"target": "m|az-b", "state": "open"}}, "probe_budget"),
    ],
)
def test_a_malformed_v1_record_is_refused(change: dict[str, Any], match: str) -> None:
    with pytest.raises(CommandError, match=match):
        Command.decode(orjson.dumps({**orjson.loads(V1_BREAKER), **change}))


@pytest.mark.parametrize("version", [0, 3, -1, "2", 2.0, True, None, [2]])
def test_other_schema_versions_are_refused(version: Any) -> None:
    obj = orjson.loads(make_cmd().encode())
    obj["schema_version"] = version
    with pytest.raises(CommandError, match="schema_version"):
        Command.decode(orjson.dumps(obj))


def test_a_missing_schema_version_is_refused() -> None:
    obj = orjson.loads(make_cmd().encode())
    del obj["schema_version"]
    with pytest.raises(CommandError, match="schema_version missing"):
        Command.decode(orjson.dumps(obj))
    with pytest.raises(CommandError, match="schema_version"):
        make_cmd(schema_version=1)  # only decode converts v1


def test_older_producer_without_hlc_decodes_unstamped() -> None:
    obj = orjson.loads(make_cmd().encode())
    del obj["hlc"]
    assert Command.decode(orjson.dumps(obj)).hlc == 0


@pytest.mark.parametrize("bad", [-1, "5", 1.5, True])
def test_bad_hlc_is_rejected(bad: object) -> None:
    with pytest.raises(CommandError, match="hlc"):
        make_cmd(hlc=bad)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("zone", ""),
        ("zone", 3),
        ("reason", None),
        ("controller", 1),
        ("basis_ms", 1.5),
        ("issued_at_ms", "1000"),
        ("expires_at_ms", True),
        ("detail", []),
        ("command_id", 5),
    ],
)
def test_top_level_fields_are_checked(field: str, bad: Any) -> None:
    with pytest.raises(CommandError, match=field):
        make_cmd(**{field: bad})


def test_not_json_or_not_an_object_is_a_command_error() -> None:
    for raw in (b"{", b"[1]", b'"x"', b"null"):
        with pytest.raises(CommandError):
            Command.decode(raw)
    with pytest.raises(CommandError, match="unexpected keyword"):
        Command.decode(orjson.dumps({**orjson.loads(make_cmd().encode()), "color": "red"}))


# -- decode never raises anything but CommandError ---------------------------------------------------------------
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
_json = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=12
)
_FIELDS = sorted(orjson.loads(make_cmd().encode()))


def _decodes_or_command_error(obj: Any) -> None:
    try:
        c = Command.decode(orjson.dumps(obj))
    except CommandError:
        return
    assert Command.decode(c.encode()) == c  # whatever decodes is a valid, re-encodable command


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_FIELDS) | _text, _json, max_size=16))
def test_decode_of_arbitrary_json_objects_raises_only_command_errors(obj: dict[str, Any]) -> None:
    _decodes_or_command_error(obj)


@settings(max_examples=600, deadline=None)
@given(
    st.sampled_from(sorted(COMMAND_KINDS)),
    st.sampled_from([1, 2]),
    st.sampled_from(_FIELDS + ["payload." + k for p in VALID.values() for k in p[1]]),
    st.one_of(st.just("<delete>"), _json),
)
def test_decode_of_a_mutated_valid_record_raises_only_command_errors(
    kind: str, version: int, path: str, value: Any
) -> None:
    obj = orjson.loads(cmd_of(kind).encode())
    if version == 1:
        obj.update(schema_version=1, target_replicas=obj["target_replicas"] or 0, command_id="")
    where, key = (obj["payload"], path[8:]) if path.startswith("payload.") else (obj, path)
    if value == "<delete>":
        where.pop(key, None)
    else:
        where[key] = value
    _decodes_or_command_error(obj)


def test_hlc_stale_rule() -> None:
    older, newer = Hlc(100, 0).encode(), Hlc(100, 1).encode()
    assert hlc_stale(older, newer)
    assert not hlc_stale(newer, older)
    assert not hlc_stale(newer, newer)  # equal is not older
    assert not hlc_stale(older, None)  # nothing applied yet
    assert not hlc_stale(0, newer)  # unstamped (older producer): skip the check


def test_order_field_is_kind_and_model() -> None:
    assert make_cmd().order_field == "scale:m"
    assert cmd_of("relocate").order_field == "relocate:m:az-a/m/r1"
    assert cmd_of("breaker").order_field == "breaker:m|az-b"


def test_a_detail_nested_past_the_limit_is_a_command_error_not_a_crash_when_signed_or_sent() -> None:
    """orjson writes 254 levels: a deeper detail used to decode, then crash the bridge when signed."""
    import orjson

    from core.jsonsafe import MAX_DEPTH
    from loop.commands import Command, CommandError

    raw = b'{"schema_version": 2, "kind": "scale", "zone": "az-a", "model": "m", "target_replicas": 1, '
    raw += b'"reason": "x", "issued_at_ms": 1, "expires_at_ms": 2, "basis_ms": 1, "detail": {"x": ' + b"[" * 300 + b"0"
    raw += b"]" * 300 + b"}}"
    with pytest.raises(CommandError, match=f"detail nested deeper than {MAX_DEPTH} levels"):
        Command.decode(raw)
    assert orjson.loads(raw)  # it is valid JSON: only the limit refuses it
