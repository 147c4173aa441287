"""Mixed agent load: dynamic RAG / tool / LLM weights (docs/model.md §15 (agents)).

An agent turn spends its budget on three kinds of work: retrieval (RAG),
tool calls and plain LLM generation.  The design source weighs them by how
settled the conversation is (``stability``: 0 = the topic jumps, 1 = converged), how
relevant the retrieved context is (``rag_score``) and how confident the
planner is in its tool call (``tool_conf``)::

    w_rag  = rag_coef  * rag_score * stability          # default 0.4
    w_tool = tool_coef * tool_conf * (1 - stability)    # default 0.5
    w_llm  = llm_base  + llm_stability_coef * stability # default 0.1 + 0.2 s

and the three are then **normalised to sum to 1** (the design source's raw
values do not: at ``stability = rag_score = 1`` they are 0.4, 0 and 0.3).
Because ``llm_base > 0`` the raw total is always positive, so normalising never
divides by zero, and LLM generation always keeps a share.  Intuition: a
converged conversation leans on retrieval and the model; a jumping one on
tools.

The reference the design source compares against is the static 1:1:1 split
(:data:`STATIC_WEIGHTS`; the source reports 842 ms mean response and 86.3 %
completion for it, against 617 ms and 93.7 % with the dynamic weights).
:func:`allocate` turns weights into integer slots (workers, replicas,
concurrency) with the largest-remainder method, so the slots add up.

Examples
--------
>>> w = weights(AgentSignals(stability=1.0, rag_score=1.0, tool_conf=1.0))
>>> round(w.rag, 4), w.tool, round(w.llm, 4)          # raw 0.4 : 0 : 0.3
(0.5714, 0.0, 0.4286)
>>> allocate(10, w)
{'rag': 6, 'tool': 0, 'llm': 4}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from controllers.errors import ParameterError, check_number
from core.vocab import AGENT_PATHS

__all__ = [
    "AGENT_CLASS_HEADER",
    "STATIC_WEIGHTS",
    "AgentSignals",
    "AgentWeightParams",
    "AgentWeights",
    "allocate",
    "pool_shares",
    "weights",
]

AGENT_CLASS_HEADER = "x-agent-class"
"""The request header naming a request's agent class (``rag``, ``tool``, ``llm``): gateways route on it."""

KINDS = AGENT_PATHS  # the weight vector is indexed like the telemetry paths


@dataclass(frozen=True)
class AgentWeightParams:
    """Coefficients of the docs/model.md §15 (agents) formulas (validated).

    The defaults are the design source's.

    Examples
    --------
    >>> AgentWeightParams().llm_base
    0.1
    >>> AgentWeightParams(llm_base=0.0)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: llm_base=0.0: must be > 0 (keeps the raw total positive)
    """

    rag_coef: float = 0.4
    tool_coef: float = 0.5
    llm_base: float = 0.1
    llm_stability_coef: float = 0.2

    def __post_init__(self) -> None:
        for name in ("rag_coef", "tool_coef", "llm_stability_coef"):
            if check_number(name, getattr(self, name)) < 0.0:
                raise ParameterError(f"{name}={getattr(self, name)}: must be >= 0")
        if check_number("llm_base", self.llm_base) <= 0.0:
            raise ParameterError(f"llm_base={self.llm_base}: must be > 0 (keeps the raw total positive)")


@dataclass(frozen=True)
class AgentSignals:
    """Per-conversation signals, each in [0, 1].

    Examples
    --------
    >>> AgentSignals(stability=1.2, rag_score=0.5, tool_conf=0.5)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: stability=1.2: must lie in [0, 1]
    """

    stability: float
    rag_score: float
    tool_conf: float

    def __post_init__(self) -> None:
        for name in ("stability", "rag_score", "tool_conf"):
            if not 0.0 <= check_number(name, getattr(self, name)) <= 1.0:
                raise ParameterError(f"{name}={getattr(self, name)}: must lie in [0, 1]")


@dataclass(frozen=True)
class AgentWeights:
    """Normalised weights (sum 1) and the raw formula values they came from."""

    rag: float
    tool: float
    llm: float
    raw_rag: float
    raw_tool: float
    raw_llm: float

    def as_dict(self) -> dict[str, float]:
        """The normalised weights by kind (``rag``, ``tool``, ``llm``)."""
        return {"rag": self.rag, "tool": self.tool, "llm": self.llm}

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return asdict(self)


STATIC_WEIGHTS = AgentWeights(1 / 3, 1 / 3, 1 / 3, 1.0, 1.0, 1.0)
"""The static 1:1:1 reference the design source compares against (docs/model.md §15 (agents))."""


def weights(signals: AgentSignals, params: AgentWeightParams | None = None) -> AgentWeights:
    """Dynamic weights of one turn (pure): the docs/model.md §15 (agents) formulas, normalised.

    Parameters
    ----------
    signals : AgentSignals
        ``stability``, ``rag_score`` and ``tool_conf``, each in [0, 1].
    params : AgentWeightParams, optional
        Coefficients; the design source's (0.4, 0.5, 0.1, 0.2) by default.

    Returns
    -------
    AgentWeights
        ``rag + tool + llm == 1`` (up to rounding), each in [0, 1].

    Examples
    --------
    >>> w = weights(AgentSignals(stability=0.0, rag_score=0.9, tool_conf=0.8))
    >>> w.raw_rag, w.raw_tool, w.raw_llm      # a jumping conversation: tools
    (0.0, 0.4, 0.1)
    >>> round(w.tool, 6), round(w.llm, 6)
    (0.8, 0.2)
    """
    p = params or AgentWeightParams()
    s = signals.stability
    raw_rag = p.rag_coef * signals.rag_score * s
    raw_tool = p.tool_coef * signals.tool_conf * (1.0 - s)
    raw_llm = p.llm_base + p.llm_stability_coef * s
    total = raw_rag + raw_tool + raw_llm  # >= llm_base > 0
    return AgentWeights(raw_rag / total, raw_tool / total, raw_llm / total, raw_rag, raw_tool, raw_llm)


def allocate(total: int, w: AgentWeights) -> dict[str, int]:
    """Split ``total`` integer slots by the weights (largest remainder).

    Each kind gets ``floor(total * w)``; the slots left over go to the
    largest fractional parts (ties in the order rag, tool, llm).  The result
    always sums to ``total`` and no kind is more than one slot away from its
    exact share.

    Examples
    --------
    >>> allocate(9, STATIC_WEIGHTS)
    {'rag': 3, 'tool': 3, 'llm': 3}
    >>> allocate(10, STATIC_WEIGHTS)          # 3.33 each: the first tie wins
    {'rag': 4, 'tool': 3, 'llm': 3}
    """
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ParameterError(f"total={total!r}: must be an int >= 0")
    exact = [total * v for v in (w.rag, w.tool, w.llm)]
    slots = [math.floor(x) for x in exact]
    order = sorted(range(3), key=lambda i: (-(exact[i] - slots[i]), i))
    for i in order[: max(0, total - sum(slots))]:
        slots[i] += 1
    return dict(zip(KINDS, slots, strict=True))


def pool_shares(w: Mapping[str, float], n_pools: int) -> dict[str, list[float]]:
    """Each agent class's traffic split over ``n_pools`` equal pools so that it holds its weight of them (pure).

    The classes (rag, tool, llm, then any others by name) are laid end to end on
    ``[0, 1)`` with lengths their normalised weights, the pools on equal
    slices of ``[0, 1)``; a class sends to each pool in proportion to the
    overlap of the two.  So class ``c`` holds ``w_c`` of the pools'
    capacity, each pool is shared by the classes whose intervals cross it (at
    most two classes share a pool boundary), and the traffic a gateway sends
    by these shares loads every pool equally when the classes arrive in
    proportion to their weights.  A class of weight 0 gets no entry (a
    gateway routes it as if no weights were set); no positive weight, or no
    pool, gives ``{}``.

    Examples
    --------
    >>> pool_shares({"rag": 0.5, "tool": 0.0, "llm": 0.5}, 4)
    {'rag': [0.5, 0.5, 0.0, 0.0], 'llm': [0.0, 0.0, 0.5, 0.5]}
    >>> {k: [round(x, 3) for x in v] for k, v in pool_shares({"rag": 0.6, "tool": 0.1, "llm": 0.3}, 2).items()}
    {'rag': [0.833, 0.167], 'tool': [0.0, 1.0], 'llm': [0.0, 1.0]}
    """
    if isinstance(n_pools, bool) or not isinstance(n_pools, int) or n_pools < 0:
        raise ParameterError(f"n_pools={n_pools!r}: must be an int >= 0")
    order = [k for k in KINDS if k in w] + sorted(k for k in w if k not in KINDS)
    clean = {k: float(w[k]) for k in order}
    for k, v in clean.items():
        if not math.isfinite(v) or v < 0.0:
            raise ParameterError(f"weights[{k!r}]={v!r}: must be finite and >= 0")
    total = sum(clean.values())
    if total <= 0.0 or n_pools == 0:
        return {}
    out: dict[str, list[float]] = {}
    lo, acc = 0.0, 0.0
    for k in order:
        acc += clean[k]
        hi = min(1.0, acc / total)
        if hi > lo:  # a weight too small to move the boundary in floating point holds nothing
            out[k] = [max(0.0, min(hi, (p + 1) / n_pools) - max(lo, p / n_pools)) / (hi - lo) for p in range(n_pools)]
        lo = hi
    return out
