"""What an executor checks before it lets a command near the desired state.

Anyone who can ``XADD`` to a zone's Redis stream can write a command there;
the :class:`CommandGuard` decides whether it came from governor and makes
sense for this deployment.  :meth:`CommandGuard.check` returns None for an
admissible command, else the reason it is refused (the executor reports it
as ``rejected``, acknowledges the entry and touches nothing else):

* **signature** -- a schema-v2 command must carry ``key_id`` and
  ``signature``, an HMAC-SHA256 by a key of the keyring over its canonical
  bytes (:mod:`core.signing`); schema-v1 commands carry none and are
  accepted only while ``GOVERNOR_ACCEPT_UNSIGNED_V1`` is on;
* **identity** -- a v2 ``command_id`` must be the one recomputed from the
  decision (:func:`loop.commands.command_id`);
* **target** -- known for its kind: a model of ``GOVERNOR_MODELS`` (scale,
  relocate, agents; canary: the base model and ``model@version``), a
  ``model|zone`` with a known model and a zone of ``GOVERNOR_ZONES``
  (breaker), a family (route: a configured model or a primary of
  ``GOVERNOR_FALLBACKS``);
* **bounds** -- a scale target within the model's [min_replicas, max_replicas];
* **time** -- a lifetime (``expires_at_ms - issued_at_ms``) no longer than
  ``GOVERNOR_COMMAND_TTL_S``; ``issued_at_ms``, ``basis_ms``, the HLC's
  physical part (``Hlc.decode(hlc).l``) and ``detail.apply_at_ms`` at most
  ``GOVERNOR_MAX_CLOCK_SKEW_S`` (wall seconds, times the clock speed) ahead
  of the executor's clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from controllers.hlc import Hlc
from core.defaults import CLOCK_SPEED
from core.settings import ModelSpec, Settings
from core.signing import Keyring, MissingKeysError
from loop.command_payloads import CanaryPayload, split_pair
from loop.commands import Command, command_id

__all__ = ["CommandGuard"]


@dataclass(frozen=True)
class CommandGuard:
    """The guard's parameters: what it reads of the settings, taken once at start (:meth:`from_settings`)."""

    keyring: Keyring
    models: Mapping[str, ModelSpec]  # name -> spec (GOVERNOR_MODELS)
    zones: frozenset[str]
    families: frozenset[str]  # the primaries of GOVERNOR_FALLBACKS
    command_ttl_s: float
    max_clock_skew_s: float
    accept_unsigned_v1: bool
    clock_speed: float = CLOCK_SPEED

    @classmethod
    def from_settings(cls, settings: Settings, keyring: Keyring | None = None) -> CommandGuard:
        """The guard of a deployment (``keyring``: else the settings' own); :class:`MissingKeysError` without one."""
        ring = keyring or settings.keyring()
        if ring is None:
            raise MissingKeysError
        return cls(
            ring,
            {m.name: m for m in settings.models},
            frozenset(settings.zones),
            frozenset(primary for primary, _ in settings.fallbacks),
            settings.command_ttl_s,
            settings.max_clock_skew_s,
            settings.accept_unsigned_v1,
            settings.clock_speed,
        )

    def check(self, cmd: Command, source_version: int, now_ms: int) -> str | None:
        """None if ``cmd`` (decoded from a record of schema ``source_version``) may be applied; else why not."""
        why = self._authentic(cmd, source_version)
        if why is None:
            why = self._target(cmd)
        if why is None:
            why = self._time(cmd, now_ms)
        return why

    def _authentic(self, cmd: Command, source_version: int) -> str | None:
        if source_version == 1:
            if not self.accept_unsigned_v1:
                return "unsigned schema-v1 command refused (GOVERNOR_ACCEPT_UNSIGNED_V1 is off)"
            return None  # v1 keeps its stored id
        why = self.keyring.verify(asdict(cmd))
        if why is not None:
            return why
        want = command_id(cmd.kind, cmd.zone, cmd.model, cmd.basis_ms, cmd.typed_payload.id_dict())
        if cmd.command_id != want:
            return f"command_id {cmd.command_id!r} does not match its content ({want!r})"
        return None

    def _target(self, cmd: Command) -> str | None:
        models = self.models
        if cmd.kind == "breaker":
            pair = split_pair(cmd.model)
            if pair is None or pair[0] not in models:
                return f"unknown breaker target {cmd.model!r}: model not in GOVERNOR_MODELS"
            if pair[1] not in self.zones:
                return f"unknown breaker target {cmd.model!r}: zone not in GOVERNOR_ZONES"
            return None
        if cmd.kind == "route":
            families = models.keys() | self.families
            if cmd.model not in families:
                return f"unknown route family {cmd.model!r} (not in GOVERNOR_MODELS or GOVERNOR_FALLBACKS)"
            return None
        if cmd.model not in models:
            return f"unknown model {cmd.model!r} for {cmd.kind} (not in GOVERNOR_MODELS)"
        if isinstance(cmd.typed_payload, CanaryPayload):
            canary = f"{cmd.model}@{cmd.typed_payload.version}"
            if canary not in models:
                return f"unknown canary model {canary!r} (not in GOVERNOR_MODELS)"
        if cmd.kind == "scale":
            spec = models.get(cmd.model)
            n = cmd.target_replicas
            if spec is not None and n is not None and not spec.min_replicas <= n <= spec.max_replicas:
                return (
                    f"target_replicas {n} outside {cmd.model}'s "
                    f"[min_replicas {spec.min_replicas}, max_replicas {spec.max_replicas}]"
                )
        return None

    def _time(self, cmd: Command, now_ms: int) -> str | None:
        ttl_ms = int(self.command_ttl_s * 1000)
        life = cmd.expires_at_ms - cmd.issued_at_ms
        if life > ttl_ms:
            return f"lifetime {life} ms above the command TTL ({ttl_ms} ms, GOVERNOR_COMMAND_TTL_S)"
        limit = now_ms + self.max_clock_skew_s * 1000 * self.clock_speed
        apply_at = cmd.detail.get("apply_at_ms")
        stamps: list[tuple[str, float]] = [
            ("issued_at_ms", cmd.issued_at_ms),  # else a lifetime within the TTL could start years ahead
            ("basis_ms", cmd.basis_ms),
            ("hlc", Hlc.decode(cmd.hlc).l),
        ]
        if isinstance(apply_at, int | float) and not isinstance(apply_at, bool):
            stamps.append(("detail.apply_at_ms", apply_at))
        for name, value in stamps:
            if value > limit:
                return (
                    f"{name} {value} is more than GOVERNOR_MAX_CLOCK_SKEW_S="
                    f"{self.max_clock_skew_s:g} ahead of the executor's clock ({now_ms})"
                )
        return None
