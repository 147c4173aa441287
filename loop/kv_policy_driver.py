"""KV relocation on the real path: node windows -> ``relocate`` commands (no I/O).

:class:`KvPolicyDriver` keeps one :class:`~controllers.kv_policy.KvPolicyState`
per (model, zone, node) and runs :func:`controllers.kv_policy.step` on each
node-scope window record (the KV allocator fields of the node's latest GPU
sample, see :func:`controllers.window_result.node_kv`).  When the policy decides to
``compact`` (or to ``move`` the waiting sessions to a peer with room) it
returns a ``relocate`` command for the zone's executor:

    payload = {"node", "max_bytes", "expected_generation", "action"}

``basis_ms`` is the window end and ``command_id`` hashes the payload, so the
same decision on the same window (a worker restart re-reading it) has the
same id and the executor drops the duplicate.

Generation contract.  ``expected_generation`` is the allocator generation of
the sample the decision was taken on.  A busy replica's generation moves with
every allocation and free (many per second), so by the time the command is
applied it has almost always changed: the executor side (sim/live.py) does
*not* require equality.  It refuses only when the current generation is
*lower* than the expected one -- the allocator was reset, i.e. the node was
replaced or restarted and the decision describes a layout that is gone.
Compaction itself is safe on any current layout (bounded by ``max_bytes``).

:meth:`KvPolicyDriver.snapshot` / :meth:`KvPolicyDriver.restore` carry the
per-node policy states, the peers' largest free blocks and the decision count
as JSON, so a restarted worker continues an episode where it stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from controllers.errors import ParameterError
from controllers.kv_policy import KvObs, KvPolicyParams, KvPolicyState, step
from controllers.window_record import WindowRecord
from loop.commands import Command
from loop.errors import SnapshotVersionError

__all__ = ["KvPolicyDriver"]

log = logging.getLogger(__name__)

SNAPSHOT_VERSION = 1


class KvPolicyDriver:
    """Per-node KV policy state; :meth:`on_window` of a node window -> a ``relocate`` command."""

    def __init__(self, params: KvPolicyParams | None = None, ttl_ms: int = 60_000) -> None:
        self.params = params or KvPolicyParams()
        self.ttl_ms = int(ttl_ms)
        self.states: dict[tuple[str, str, str], KvPolicyState] = {}
        # latest largest free block per node, for the 'move' decision's peer room
        self._largest: dict[tuple[str, str], dict[str, int]] = {}
        self.decisions = 0

    def on_window(self, record: WindowRecord, now_ms: int) -> list[Command]:
        """Run the policy on one node window; a command when it compacts or moves."""
        if record.scope != "node" or record.node is None:
            return []
        model, zone, node = record.model, record.zone, record.node
        largest, free, waiting = record.largest_free_block_bytes, record.kv_free_bytes, record.kv_waiting_bytes
        frag, generation = record.fragmentation_ratio, record.kv_generation
        if largest is None or free is None or waiting is None or frag is None or generation is None:
            return []  # no allocator telemetry
        if record.replicas_ready == 0:
            return []  # the node is not serving
        peers = self._largest.setdefault((model, zone), {})
        peers[node] = largest
        try:
            obs = KvObs(
                largest, free, waiting, frag, generation, max((v for n, v in peers.items() if n != node), default=0)
            )
        except ParameterError:
            return []  # inconsistent sample (e.g. largest free > free): skip this window
        key = (model, zone, node)
        state, decision = step(self.params, self.states.get(key, KvPolicyState()), obs)
        self.states[key] = state
        if decision.action not in ("compact", "move"):
            return []
        self.decisions += 1
        basis = record.window_end_ms
        return [
            Command(
                kind="relocate",
                zone=zone,
                model=model,
                reason=decision.reason,
                issued_at_ms=now_ms,
                expires_at_ms=now_ms + self.ttl_ms,
                basis_ms=basis,
                controller="kv_policy",
                detail={"round": decision.round, "target_fragmentation": decision.target_fragmentation},
                payload={
                    "node": node,
                    "max_bytes": decision.bytes_budget,
                    "expected_generation": decision.expected_generation,
                    "action": decision.action,
                },
            )
        ]

    def snapshot(self, only: str | None = None) -> dict[str, Any]:
        """Per-node policy states, peers' largest free blocks and the decision count (plain data).

        ``only`` keeps one model's nodes (the worker stores one snapshot per model).
        """
        return {
            "version": SNAPSHOT_VERSION,
            "decisions": self.decisions,
            "states": [[*key, st.to_dict()] for key, st in self.states.items() if only in (None, key[0])],
            "largest": [
                [model, zone, dict(peers)] for (model, zone), peers in self._largest.items() if only in (None, model)
            ],
        }

    def restore(self, data: Mapping[str, Any]) -> int:
        """Load a :meth:`snapshot` (all or nothing, merged into memory); returns the number of nodes."""
        if data.get("version") != SNAPSHOT_VERSION:
            raise SnapshotVersionError(
                f"KV policy snapshot version {data.get('version')!r} (this worker: {SNAPSHOT_VERSION})"
            )
        states = {(m, z, n): KvPolicyState.from_dict(st) for m, z, n, st in data["states"]}
        largest = {(m, z): {str(n): int(v) for n, v in peers.items()} for m, z, peers in data["largest"]}
        decisions = int(data.get("decisions", 0))
        self.states.update(states)  # all or nothing: built first, then merged
        self._largest.update(largest)
        self.decisions = max(self.decisions, decisions)
        return len(states)
