"""The closed vocabularies of telemetry records: one definition for every layer.

The ingest checks, the window columns, the agent-weight controller, the command
payloads and the simulator all read these tuples, so a new status, GPU state
or agent path is added here once.

>>> AGENT_PATHS
('rag', 'tool', 'llm')
>>> "timeout" in REQUEST_STATUSES
True
"""

from __future__ import annotations

__all__ = [
    "AGENT_PATHS",
    "AGENT_SIGNALS",
    "GPU_STATES",
    "READY_STATES",
    "REQUEST_STATUSES",
    "STARTING_STATES",
]

#: How a finished request ended; anything but ``ok`` violates the SLO.
REQUEST_STATUSES = frozenset({"ok", "error", "timeout"})
#: A replica's lifecycle state in a GPU sample.
GPU_STATES = frozenset({"starting", "ready", "draining"})
#: States that count as serving capacity, and as capacity on its way.
READY_STATES = frozenset({"ready"})
STARTING_STATES = frozenset({"starting"})
#: The path an agent turn took (docs/model.md, agent weights); the order is
#: the index used by the window columns and the weight vector.
AGENT_PATHS = ("rag", "tool", "llm")
#: The three per-turn agent signals a request record may carry (all or none).
AGENT_SIGNALS = ("agent_stability", "agent_rag_score", "agent_tool_conf")
