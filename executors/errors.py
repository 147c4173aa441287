"""How a backend says a command could not be applied (:mod:`executors.backends`).

* :class:`BackendUnavailable` -- temporary: the entry stays pending and is
  retried after ``retry_idle_ms`` (up to ``GOVERNOR_MAX_DELIVERIES``);
* :class:`BackendRejected` -- permanent: acknowledged, outcome ``failed``;
* :class:`BackendRefused` -- permanent and decided before anything was
  attempted (a fleet budget, a kind no backend of the chain takes):
  acknowledged, outcome ``rejected``.
"""

from __future__ import annotations

__all__ = ["BackendRefused", "BackendRejected", "BackendUnavailable"]


class BackendUnavailable(RuntimeError):
    """Temporary: try the same command again later."""


class BackendRejected(RuntimeError):
    """Permanent: this backend cannot apply this command (outcome ``failed``)."""


class BackendRefused(BackendRejected):
    """Permanent, refused before anything was attempted (outcome ``rejected``)."""
