"""The config file (core.config_file): reading, sections, every error path, env overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from core.config_file import MAX_BYTES, ConfigFile
from core.settings import CONFIG_ENV, ClassSlo, ModelSpec, Settings, SettingsError, json_schema
from governor.config_cmd import show

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "infra" / "governor.example.yaml"
KEY = "k1:" + bytes(range(32)).hex()  # a valid command signing key (32 distinct bytes)


def _write(tmp_path: Path, text: str | bytes, name: str = "governor.yaml") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def _error(tmp_path: Path, text: str | bytes, env: dict[str, str] | None = None) -> str:
    """The message of the error reading ``text`` as a config file, without the file's name."""
    path = _write(tmp_path, text)
    with pytest.raises(SettingsError) as info:
        Settings.load(env or {}, path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    return message[len(path) + 2 :]


def test_fields_and_sections_become_settings(tmp_path: Path) -> None:
    text = """
zones: [eu-1, eu-2]
pid_gains: {kp: 0.1, ki: 0.2, kd: 0}    # a field name: its value as is, though a mapping
scrape:
  interval_s: 3
  k8s: {selector: app=vllm, port: 9000} # sections nest
kafka:
  sasl: {username: gov}
"""
    cfg = ConfigFile.read(_write(tmp_path, text))
    assert cfg.paths == {
        "zones": "zones",
        "pid_gains": "pid_gains",
        "scrape_interval_s": "scrape.interval_s",
        "scrape_k8s_selector": "scrape.k8s.selector",
        "scrape_k8s_port": "scrape.k8s.port",
        "kafka_sasl_username": "kafka.sasl.username",
    }
    s, sources = Settings.load({}, cfg.path)
    assert s.zones == ("eu-1", "eu-2") and s.pid_gains == {"kp": 0.1, "ki": 0.2, "kd": 0.0}
    assert (s.scrape_interval_s, s.scrape_k8s_selector, s.scrape_k8s_port) == (3.0, "app=vllm", 9000)
    assert isinstance(s.scrape_interval_s, float) and s.kafka_sasl_username == "gov"
    assert set(sources.values()) == {"file"} and set(sources) == set(cfg.paths)


def test_integral_numbers_take_the_field_type(tmp_path: Path) -> None:
    s, _ = Settings.load({}, _write(tmp_path, "partitions: 8.0\nwindow_s: 5\n"))
    assert (s.partitions, s.window_s) == (8, 5.0)
    assert type(s.partitions) is int and type(s.window_s) is float


def test_model_classes_from_the_file(tmp_path: Path) -> None:
    text = """
models:
  - name: m
    ttft_slo_ms: 900
    classes:
      voice: {itl_slo_ms: 40}
      trading: {ttft_slo_ms: 250}
"""
    s, _ = Settings.load({}, _write(tmp_path, text))
    (m,) = s.models
    assert m.classes == {"trading": ClassSlo(ttft_slo_ms=250), "voice": ClassSlo(itl_slo_ms=40)}
    assert list(m.classes) == ["trading", "voice"]  # REQUEST_CLASSES order, whatever the file's
    assert (m.slo("trading"), m.slo("voice"), m.slo("batch"), m.slo(None)) == (
        (250, 150.0),
        (900, 40),
        (900, 150.0),
        (900, 150.0),
    )


# (file text, the message after "<file>: "); one comment per case.
ERRORS = [
    ("models:\n  - {name: a}\n  - {name: b, ttft_slo_ms: -5}\n", "models[1].ttft_slo_ms: must be > 0 (got -5)"),
    ("zone: [a]\n", "zone: unknown key (did you mean 'zones'?)"),  # a typo of a field
    ("scrape:\n  intervl_s: 5\n", "scrape.intervl_s: unknown key (did you mean 'interval_s'?)"),  # in a section
    ("bogus: 1\n", "bogus: unknown key"),  # nothing close
    ("scrape: 5\n", "scrape: is a section: give a mapping of bearer_token_file, endpoints, engine, http_sd, "
     "interval_s, k8s_namespace, ..."),  # a section needs a mapping
    ("scrape_interval_s: 5\nscrape: {interval_s: 4}\n",
     "scrape.interval_s: sets scrape_interval_s again (already set at scrape_interval_s)"),  # one field, two keys
    ("zones: [a]\nzones: [b]\n", "line 2, column 1: not valid YAML: duplicate key 'zones'"),
    ("x: &a [1]\nzones: *a\n", "line 2, column 8: not valid YAML: anchors and aliases (*name) are not supported"),
    ("zones: [a\n", "line 2, column 1: not valid YAML: expected ',' or ']', but got '<stream end>'"),
    ("1: 2\n", "line 1, column 1: not valid YAML: keys must be strings (got 1; quote it)"),
    ("on: 2\n", "line 1, column 1: not valid YAML: keys must be strings (got True; quote it)"),  # YAML 1.1 bool
    ("", "the top level must be a mapping of settings (the file is empty)"),
    ("- a\n", "the top level must be a mapping of settings (the file is a list)"),
    ("42\n", "the top level must be a mapping of settings (the file is a number)"),
    ("partitions: 4.5\n", "partitions: must be an integer (got 4.5)"),
    ("drift: maybe\n", "drift: must be true or false (got 'maybe')"),
    ("zones: a, b\n", "zones: must be a list (got 'a, b')"),  # the file takes lists, not the env's CSV
    ("zones: []\n", "zones: must have at least 1 item (got [])"),
    ("zones: ['']\n", "zones[0]: must not be empty"),
    ("eps_ref: 1.5\n", "eps_ref: must be < 1 (got 1.5)"),
    ("partitions: 0\n", "partitions: must be >= 1 (got 0)"),
    ("controller: pi\n", "controller: choose one of pid, fpid (got 'pi')"),
    ("window_s: .nan\n", "window_s: must be finite (got nan)"),  # passes the schema; Settings' own check
    ("window_s: .inf\n", "window_s: must be finite (got inf)"),
    ("zones: [a, b]\nzone_redundancy: 2\n",
     "zone_redundancy: must be below the number of zones (2) (got 2)"),  # cross-field
    ("models:\n  - {ttft_slo_ms: 5}\n", "models[0]: missing the key 'name'"),
    ("models:\n  - {name: m, ttf_slo_ms: 5}\n", "models[0].ttf_slo_ms: unknown key (did you mean 'ttft_slo_ms'?)"),
    ("models:\n  - {name: m, min_replicas: 5, max_replicas: 2}\n",
     "models[0]: need 1 <= min_replicas (5) <= max_replicas (2)"),  # the dataclass's cross-field rule
    ("models:\n  - {name: m}\n  - {name: m}\n", "models: model 'm' is listed twice"),
    ("models:\n  - name: m\n    classes: {gold: {ttft_slo_ms: 5}}\n",
     "models[0].classes.gold: unknown request class (choose from trading, voice, batch)"),
    ("models:\n  - name: m\n    classes: {voice: {ttft_slo_ms: 0}}\n",
     "models[0].classes.voice.ttft_slo_ms: must be > 0 (got 0)"),
    ("models:\n  - name: m\n    classes: {voice: {ttf_slo_ms: 3}}\n",
     "models[0].classes.voice.ttf_slo_ms: unknown key (did you mean 'ttft_slo_ms'?)"),
    ("models:\n  - name: m\n    classes: {voice: 300}\n", "models[0].classes.voice: must be a mapping (got 300)"),
    ("pid_gains: {kp: high}\n", "pid_gains.kp: must be a number (got 'high')"),
    ("pid_gains: {ff_eror_margin: 1}\n",  # a typo is refused, not ignored
     "pid_gains.ff_eror_margin: unknown key (did you mean 'ff_error_margin'?)"),
    ("fallbacks: [[a, a]]\n", "fallbacks: 'a' falls back to itself"),
    ("fallbacks: [[a]]\n", 'fallbacks[0]: must have at least 2 items (got ["a"])'),
    ("kafka_security_protocol: SASL_PLAINTEXT\n",  # a cross-field rule of another module: the file's names
     "kafka_security_protocol=SASL_PLAINTEXT needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), ERRORS)
def test_every_error_names_the_path_in_plain_words(tmp_path: Path, text: str, message: str) -> None:
    assert _error(tmp_path, text) == message


def test_file_limits(tmp_path: Path) -> None:
    assert _error(tmp_path, "#" * (MAX_BYTES + 1)) == "the file is larger than 1024 KiB"
    assert _error(tmp_path, b"zones: [\xff]\n") == "not UTF-8 text (byte 8)"
    assert _error(tmp_path, "x: " + "[" * 50_000) == "nested too deeply"
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(SettingsError, match=rf"^{missing}: cannot read the file: No such file or directory$"):
        Settings.load({}, missing)


@pytest.mark.parametrize(
    "text",
    [
        f"command_keys: 'k1:{'zz' * 40}'\n",  # not hex
        "command_keys: 'k1:abcd'\n",  # too short
        "redis_url: 5\n",  # wrong type
        "kafka_sasl_password: [p4ssw0rd-secret]\n",
    ],
)
def test_secrets_are_never_shown(tmp_path: Path, text: str) -> None:
    message = _error(tmp_path, text)
    assert "zz" not in message and "abcd" not in message and "p4ssw0rd" not in message, message


def test_the_environment_overrides_the_file_field_by_field(tmp_path: Path) -> None:
    path = _write(tmp_path, "zones: [a, b, c]\neps_ref: 0.05\nscrape: {interval_s: 2}\n")
    env = {"GOVERNOR_EPS_REF": "0.1", "GOVERNOR_ZONES": "", "KAFKA_BOOTSTRAP": "k:9"}  # "" = unset
    s, sources = Settings.load(env, path)
    assert (s.zones, s.eps_ref, s.scrape_interval_s, s.kafka_bootstrap) == (("a", "b", "c"), 0.1, 2.0, "k:9")
    assert sources == {"zones": "file", "eps_ref": "env", "scrape_interval_s": "file", "kafka_bootstrap": "env"}
    assert Settings.from_env({**env, CONFIG_ENV: path}) == s


def test_an_error_names_the_source_that_set_the_value(tmp_path: Path) -> None:
    path = _write(tmp_path, "zones: [a, b]\nzone_redundancy: 1\n")
    with pytest.raises(SettingsError, match=r"^GOVERNOR_ZONE_REDUNDANCY=5: must be below the number of zones \(2\)$"):
        Settings.load({"GOVERNOR_ZONE_REDUNDANCY": "5"}, path)  # the bad value is the environment's
    with pytest.raises(SettingsError, match=r"zone_redundancy: must be below the number of zones \(1\) \(got 1\)$"):
        Settings.load({"GOVERNOR_ZONES": "only"}, path)  # the environment shrank the zones: the file's value fails
    with pytest.raises(SettingsError, match=r"^GOVERNOR_EPS_REF='x': could not convert"):
        Settings.load({"GOVERNOR_EPS_REF": "x"}, path)


def test_files_named_in_the_file_are_read_like_the_environments(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(KEY + "\n")
    gains = tmp_path / "gains.json"
    gains.write_text(json.dumps({"gains": {"kp": 0.5, "ki": 0.1, "kd": 0.0}}))
    s, sources = Settings.load({}, _write(tmp_path, f"command:\n  keys_file: {keys}\ngains_file: {gains}\n"))
    assert s.command_keys == KEY and s.pid_gains == {"kp": 0.5, "ki": 0.1, "kd": 0.0}
    assert sources["command_keys"] == sources["pid_gains"] == "file"


def test_gains_from_the_environment_and_a_gains_file_are_checked_by_name_and_value(tmp_path: Path) -> None:
    ok = Settings.load({"GOVERNOR_PID_GAINS": '{"ki": 0.1, "ff_target_util": 0.9, "ff_error_margin": 1.0}'}, None)[0]
    assert ok.pid_gains == {"ki": 0.1, "ff_target_util": 0.9, "ff_error_margin": 1.0}
    with pytest.raises(SettingsError, match=r"^GOVERNOR_PID_GAINS: unknown gain 'kpp' \(known: kp, ki, "):
        Settings.load({"GOVERNOR_PID_GAINS": '{"kpp": 0.1}'}, None)
    with pytest.raises(SettingsError, match=r"^GOVERNOR_PID_GAINS: ki=inf: must be a finite number$"):
        Settings.load({"GOVERNOR_PID_GAINS": '{"ki": Infinity}'}, None)
    gains = tmp_path / "gains.json"
    gains.write_text(json.dumps({"gains": {"ki": 0.1, "ff_headroom": 1.2}}))
    with pytest.raises(SettingsError, match=r"unknown gain 'ff_headroom'"):
        Settings.load({"GOVERNOR_GAINS_FILE": str(gains)}, None)


def test_every_gain_a_controller_reads_is_a_known_name() -> None:
    from controllers.scaling_law import FF_TUNABLES
    from core.vocab import PID_GAIN_NAMES

    fpid_names = {"alpha", "eta", "gamma", "beta", "memory"}  # what pid_params_for passes to FpidParams
    pid_names = {"kp", "ki", "kd", "kp_down", "ki_down", "kd_down", "deadband"}  # both controllers
    assert {f"ff_{n}" for n in FF_TUNABLES} | fpid_names | pid_names == set(PID_GAIN_NAMES)


def test_classes_survive_the_child_process_round_trip(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "models:\n  - name: m\n    classes: {trading: {ttft_slo_ms: 300}, batch: {itl_slo_ms: 900}}\n"
    )
    s, _ = Settings.load({}, path)
    env = s.to_env()
    assert json.loads(env["GOVERNOR_MODELS"])[0]["classes"] == {
        "trading": {"ttft_slo_ms": 300},
        "batch": {"itl_slo_ms": 900},
    }
    assert Settings.from_env(env) == s  # the child's environment alone
    assert Settings.from_env({CONFIG_ENV: path, **env}) == s  # as launch.processes starts children


def test_governor_models_json_takes_classes_too() -> None:
    models = [{"name": "m", "classes": {"voice": {"ttft_slo_ms": 700}}}]
    s = Settings.from_env({"GOVERNOR_MODELS": json.dumps(models)})
    assert s.models[0].slo("voice") == (700, 150.0)
    bad = json.dumps([{"name": "m", "classes": {"gold": {}}}])
    with pytest.raises(SettingsError, match=r"unknown request class 'gold' \(choose from trading, voice, batch\)"):
        Settings.from_env({"GOVERNOR_MODELS": bad})
    bad = json.dumps([{"name": "m", "classes": {"voice": {"ttft_slo_ms": -1}}}])
    with pytest.raises(SettingsError, match=r"class voice: ttft_slo_ms must be a finite number > 0"):
        Settings.from_env({"GOVERNOR_MODELS": bad})


def test_models_without_classes_keep_their_json_form() -> None:
    assert ModelSpec("m").to_dict() == {
        "name": "m",
        "ttft_slo_ms": 1000.0,
        "itl_slo_ms": 150.0,
        "min_replicas": 1,
        "max_replicas": 64,
        "replica_capacity_rps": None,
        "replica_headroom": None,
        "max_replicas_total": None,
    }
    assert hash(ModelSpec("m", classes={"voice": ClassSlo()})) == hash(ModelSpec("m"))  # classes are not hashed


def test_the_example_file_is_valid_and_uses_every_part(tmp_path: Path) -> None:
    s, sources = Settings.load({}, str(EXAMPLE))
    assert len(s.models) >= 2 and any(m.classes for m in s.models) and len(s.zones) >= 2
    for name in ("zones", "models", "eps_ref", "pid_gains", "scrape_interval_s", "scrape_k8s_selector"):
        assert sources.get(name) == "file", name


def test_the_schema_is_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(json_schema())


def test_show_prints_a_valid_config_without_secrets(tmp_path: Path) -> None:
    env = {"REDIS_URL": "redis://:hunter2@r:6379/0", "GOVERNOR_COMMAND_KEYS": KEY}
    s, sources = Settings.load(env, str(EXAMPLE))
    out = show(s, sources, str(EXAMPLE))
    assert "hunter2" not in out and KEY[3:] not in out
    assert "# redis_url: (secret, set)  # env" in out
    again, _ = Settings.load({}, _write(tmp_path, out, "shown.yaml"))
    secrets: dict[str, Any] = {"redis_url": s.redis_url, "command_keys": s.command_keys}
    assert again.replace(**secrets) == s


def test_a_bad_file_named_in_the_file_is_named_by_its_key(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    message = _error(tmp_path, f"gains_file: {missing}\n")
    assert message.startswith(f"gains_file={str(missing)!r}: "), message
