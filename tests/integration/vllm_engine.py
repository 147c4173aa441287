"""One real vLLM engine (the engine venv's Python, the tiny model) for the tests that need one:
pinned to a core, in a session of its own, killed as a process group however the test ends."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from engines.setup import engine_env
from launch.embedded import free_port

#: A loaded two-core machine takes about 2.5 min from process start to /health (docs: real-engines.md).
STARTUP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Engine:
    url: str
    pid: int
    startup_s: float  # process start -> /health answered 200
    log: Path


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@contextmanager
def vllm_engine(
    python: Path, model: Path, log: Path, *, core: int = 1, served_name: str = "tiny", extra: tuple[str, ...] = ()
) -> Iterator[Engine]:
    port = free_port()
    env = {**engine_env(), "VLLM_CPU_OMP_THREADS_BIND": str(core), "VLLM_CPU_KVCACHE_SPACE": "1"}
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "8"]
    started = time.monotonic()
    with open(log, "ab") as fh:
        proc = subprocess.Popen([*argv, *extra], stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while not _healthy(url):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace").splitlines()[-30:]
                raise RuntimeError(f"the engine exited {proc.returncode} before /health:\n" + "\n".join(tail))
            if time.monotonic() - started > STARTUP_TIMEOUT_S:
                raise RuntimeError(f"the engine did not answer /health in {STARTUP_TIMEOUT_S:g} s (log: {log})")
            time.sleep(1.0)
        yield Engine(url, proc.pid, time.monotonic() - started, log)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the API server, its EngineCore and its worker
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left
        proc.wait()
