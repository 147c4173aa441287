"""Settings in sections, and components built from their own parameter objects (issue 32 item 4)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core.settings import SECTIONS, Settings, SettingsError, json_schema, section, section_of, settings_table
from executors.guard import CommandGuard
from loop.agent_weights_driver import AgentWeightsDriver
from loop.breaker_driver import BreakerDriver, BreakerDriverParams
from loop.control_loop import ControlLoop
from loop.routing_driver import RoutingDriver, RoutingDriverParams


def test_every_field_is_in_exactly_one_section() -> None:
    listed = [name for members in SECTIONS.values() for name in members]
    assert sorted(listed) == sorted(f.name for f in dataclasses.fields(Settings))
    assert len(listed) == len(set(listed))


def test_the_schema_and_the_table_carry_the_sections() -> None:
    props = json_schema()["properties"]
    assert {name: p["x-section"] for name, p in props.items()} == {name: section_of(name) for name in props}
    rows = settings_table().splitlines()[2:]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == [s for s, members in SECTIONS.items() for _ in members]


def test_a_section_is_a_view_of_the_settings() -> None:
    s = Settings(window_s=5.0, fallbacks=(("a", "b"),))
    assert section(s, "routing") == {"fallbacks": (("a", "b"),)}
    assert section(s, "loop")["window_s"] == 5.0


def test_the_drivers_keep_their_parameter_objects_not_the_settings() -> None:
    s = Settings(window_s=5.0, breaker_min_requests=7, fallbacks=(("llama2-70b", "small"),))
    routing, breaker = RoutingDriver.from_settings(s), BreakerDriver.from_settings(s)
    assert routing.params == RoutingDriverParams.from_settings(s) and routing.params.window_s == 5.0
    assert breaker.config == BreakerDriverParams.from_settings(s) and breaker.params.min_requests == 7
    for driver in (routing, breaker):
        assert not any(isinstance(v, Settings) for v in vars(driver).values())


def test_the_control_loop_hands_its_drivers_no_settings_bag() -> None:
    """The drivers converted so far keep their parameters, never the whole Settings."""
    loop = ControlLoop(Settings(fallbacks=(("llama2-70b", "small"),)))
    for driver in (loop.routing, loop.breaker, loop.agent_weights, loop.watch, loop.platform):
        assert not any(isinstance(v, Settings) for v in vars(driver).values()), type(driver).__name__
    assert AgentWeightsDriver.from_settings(Settings(command_ttl_s=9.0)).command_ttl_s == 9.0


def test_a_config_file_may_group_fields_by_component_section(tmp_path: Path) -> None:
    path = tmp_path / "governor.yaml"
    path.write_text(
        "loop: {window_s: 5, lateness_s: 1}\n"
        "routing: {fallbacks: [[big, small]]}\n"
        "scrape: {scrape_engine: sglang, interval_s: 2}\n"  # a section's field, and the scrape_ prefix
    )
    s, sources = Settings.load({}, str(path))
    assert (s.window_s, s.lateness_s, s.fallbacks) == (5.0, 1.0, (("big", "small"),))
    assert (s.scrape_engine, s.scrape_interval_s) == ("sglang", 2.0)
    assert sources["window_s"] == "file"
    path.write_text("loop: {fallbacks: [[big, small]]}\n")  # a field of another section
    with pytest.raises(SettingsError, match=r"loop\.fallbacks: unknown key"):
        Settings.load({}, str(path))


def test_the_executor_guard_keeps_its_parameters_not_the_settings() -> None:
    key = "k1:" + bytes(range(32)).hex()
    s = Settings(command_keys=key, max_clock_skew_s=7.0, fallbacks=(("chat", "llama2-70b"),))
    guard = CommandGuard.from_settings(s)
    assert (guard.max_clock_skew_s, guard.families, set(guard.models)) == (7.0, {"chat"}, {"llama2-70b"})
    assert not any(isinstance(v, Settings) for v in vars(guard).values())
