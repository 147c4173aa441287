"""Every Kafka topic and Redis key name governor uses, in one place.

Topics are ``<prefix>.<name>``; Redis keys are ``<prefix>:...``.  The worker,
the executors, the simulated fleet and the gateway contract all build their
names here, so a key read by one process is the key written by the other.

>>> topic("governor", "telemetry")
'governor.telemetry'
>>> command_stream("governor", "az-a"), desired_replicas("governor", "az-a")
('governor:commands:az-a', 'governor:fleet:az-a:desired')
"""

from __future__ import annotations

__all__ = [
    "LEGACY_SNAPSHOT_PARTS",
    "TOPICS",
    "applied_marker",
    "breaker_hash",
    "canary_state",
    "command_stream",
    "desired_replicas",
    "executor_heartbeat",
    "executor_last_result",
    "executor_last_basis",
    "executor_last_hlc",
    "paused",
    "relocate_queue",
    "relocated_outcomes",
    "relocation_inflight",
    "retune",
    "retune_paused",
    "routing_hash",
    "snapshot",
    "status",
    "topic",
    "topics",
    "worker_heartbeat",
    "zone_allowance",
]

#: The topics governor creates, in creation order.
TOPICS = ("telemetry", "metrics", "commands", "results", "deadletter", "events")


def topic(prefix: str, name: str) -> str:
    """The Kafka topic ``name`` under ``prefix``."""
    return f"{prefix}.{name}"


def topics(prefix: str) -> dict[str, str]:
    """Every topic of :data:`TOPICS` under ``prefix``."""
    return {name: topic(prefix, name) for name in TOPICS}


# -- commands: worker -> bridge -> one stream per zone -> executor ------------------------
def command_stream(prefix: str, zone: str) -> str:
    """The Redis stream one zone's executor reads (consumer group ``executors``)."""
    return f"{prefix}:commands:{zone}"


def applied_marker(prefix: str, zone: str, command_id: str) -> str:
    """Set (24 h TTL) when ``command_id`` was applied in ``zone``: later copies are duplicates."""
    return f"{prefix}:applied:{zone}:{command_id}"


def executor_last_basis(prefix: str, zone: str) -> str:
    """Hash ``(kind|)model -> basis_ms`` of the last applied command (staleness)."""
    return f"{prefix}:executor:{zone}:last_basis"


def executor_last_hlc(prefix: str, zone: str) -> str:
    """Hash ``(kind|)model -> HLC`` of the last applied command (staleness)."""
    return f"{prefix}:executor:{zone}:last_hlc"


def executor_heartbeat(prefix: str, zone: str) -> str:
    """Set by a zone's executor every few seconds with a TTL (JSON ``{"ts_ms", "executor", "backend"}``):
    while it exists the zone's executor is alive, and the worker does not call the zone lost on one
    silent telemetry stream."""
    return f"{prefix}:executor:{zone}:heartbeat"


def platform_replicas(prefix: str, zone: str) -> str:
    """Hash ``model -> JSON {"desired", "ready", "starting", "at_ms", "source"}``: a zone's replica truth from
    its platform (the ``k8s`` backend reads the workload's status), written by the zone's executor every
    heartbeat; the worker prefers it to the counts in the GPU records while it is fresh (Pending pods count
    as starting, so the scaler holds instead of escalating while pods wait for GPUs)."""
    return f"{prefix}:platform:{zone}:replicas"


def admission(prefix: str) -> str:
    """Hash ``<orchestrator>|<task> -> JSON`` of periodic agent tasks and their admission state
    (``governor admission add|list|check|remove`` write and read it; the worker decides:
    :mod:`loop.admission_driver`)."""
    return f"{prefix}:admission"


def executor_last_result(prefix: str, zone: str) -> str:
    """Hash ``model -> JSON {"command_id", "kind", "outcome", "reason", "at_ms", "target_replicas"}``:
    the last command of each model a zone's executor finished, for ``governor status``."""
    return f"{prefix}:executor:{zone}:last_result"


def paused(prefix: str) -> str:
    """Set by ``governor pause`` (JSON ``{"reason", "paused_at_ms"}``): every executor holds
    its commands (outcome ``advisory``) until ``governor resume`` deletes it."""
    return f"{prefix}:paused"


def retune_paused(prefix: str) -> str:
    """Set by ``governor pause --retune`` (JSON ``{"reason", "paused_at_ms"}``): the kill switch of online
    retuning; while it exists the worker keeps the configured gains in force and applies no proposal
    (``governor resume --retune`` deletes it)."""
    return f"{prefix}:retune:paused"


def retune(prefix: str) -> str:
    """Hash ``model -> JSON`` the worker writes after each retune: the mode, the gains in force, the proposal
    and its expected effect, what was done and why (:mod:`loop.retune_driver`), for ``governor status``."""
    return f"{prefix}:retune"


def relocation_inflight(prefix: str, zone: str) -> str:
    """Where an executor keeps the relocation outcomes it is publishing."""
    return f"{prefix}:executor:{zone}:relocated:inflight"


# -- the fleet contract (sim backend <-> simulated or real fleet) -------------------------
def desired_replicas(prefix: str, zone: str) -> str:
    """Hash ``model -> target replicas``: a Deployment's ``spec.replicas`` per model."""
    return f"{prefix}:fleet:{zone}:desired"


def relocate_queue(prefix: str, zone: str) -> str:
    """List of KV relocation requests the fleet pops and applies."""
    return f"{prefix}:fleet:{zone}:relocate"


def relocated_outcomes(prefix: str, zone: str) -> str:
    """List where the fleet reports each relocation's outcome."""
    return f"{prefix}:fleet:{zone}:relocated"


def zone_allowance(prefix: str, zone: str) -> str:
    """JSON ``{"total", "models", "fleet_total", "fleet_models", "by", "at_ms"}``: the zone's share of the
    fleet budget (:class:`core.budget.Allowance`), written by the worker or ``governor budget`` and only
    read by the zone's executor, which keeps its zone's desired replicas within it."""
    return f"{prefix}:budget:{zone}:allowance"


# -- the gateway contract (routing backend <-> gateway) -----------------------------------
def routing_hash(prefix: str, zone: str) -> str:
    """Hash of route weights (and ``_agents|<model>`` weights) a gateway reads."""
    return f"{prefix}:routing:{zone}"


def breaker_hash(prefix: str, zone: str) -> str:
    """Hash ``model|zone -> breaker state`` a gateway reads."""
    return f"{prefix}:breaker:{zone}"


# -- the worker's own state ----------------------------------------------------------------
def canary_state(prefix: str, model: str) -> str:
    """The rollout of ``model`` (written by ``governor canary``, advanced by the worker)."""
    return f"{prefix}:canary:{model}"


def snapshot(prefix: str, scope: str) -> str:
    """The learned state of one scope: ``model:<name>`` (scaler, breaker, KV policy, agent
    weights of that model) or ``family:<primary>`` (its routing), see :mod:`streams.snapshots`.

    >>> snapshot("governor", "model:llama2-70b")
    'governor:snapshot:model:llama2-70b'
    """
    return f"{prefix}:snapshot:{scope}"


def status(prefix: str) -> str:
    """Hash ``model|zone -> JSON`` the worker writes after each zone window: what ``governor status``
    shows of that (model, zone) (:class:`loop.effects.StatusRow`, written by :class:`streams.agents.Worker`)."""
    return f"{prefix}:status"


def worker_heartbeat(prefix: str) -> str:
    """Set by the worker about every second with a TTL (JSON ``{"ts_ms", "wall_ms"}``): while it
    exists a worker is alive."""
    return f"{prefix}:worker:heartbeat"


#: The keys of the per-driver snapshots of earlier versions (one key per driver, every model in it):
#: never read again, only reported as an older version when found.
LEGACY_SNAPSHOT_PARTS = ("scaler", "routing", "breaker", "kv", "agents")
