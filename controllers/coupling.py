"""Resource-semantics coupling graph (docs/model.md (coupling)): how strongly two GPU nodes belong together.

Pure: plain data in (:class:`NodeInfo`: a node's zone, model, request-class
mix and the prefix-block hashes it holds), a :class:`CouplingGraph` out.
Design source §2.3 gives the formula

    coupling(a, b) = w_path * 1 / (1 + d(a, b)) + w_cos * cosine(emb_a, emb_b)

with ``w_path = 0.6``, ``w_cos = 0.4`` (:data:`core.vocab.DEFAULT_COUPLING_WEIGHTS`,
configurable; they must sum to 1 so coupling stays in [0, 1]).  The source
leaves the graph's edges and the embeddings open; governor's choices:

*Graph* (undirected :class:`networkx.Graph`: every relation below is
symmetric).  Vertices ``zone:<z>``, ``model:<m>``, ``node:<n>`` and, when a
class mix is given, ``class:<c>``.  Edges carry a *strength* in (0, 1] and a
*length* ``1 / strength``:

- node -- its zone, strength ``zone_strength`` (1.0);
- node -- its model, strength ``model_strength`` (1.0);
- node -- a request class, strength = the class's share of the node's
  requests (edges under ``min_strength`` are left out);
- node -- node, strength = the MinHash estimate of the Jaccard similarity of
  their prefix-hash sets (KV prefix sharing), when ``>= min_strength``.

``d(a, b)`` is the *weighted* shortest-path length (sum of lengths): with
unweighted hops a 1 % prefix overlap would couple two nodes as tightly as a
100 % one.  Two nodes of one zone and model are at ``d = 2`` (through the
zone), so the path term is 1/3; a prefix edge shortens that only when the
overlap exceeds 1/2.  Unconnected nodes have a path term of 0.

*Embeddings* (blocks, each unit-normalised, weighted ``embedding_weights``,
default 1/4 each): one-hot model, one-hot zone, the request-class mix
(shares), and the node's MinHash signature, embedded as the one-hot of
(slot, min-hash) pairs, so that the block's cosine is the share of agreeing
slots: the MinHash estimate of the Jaccard similarity.  A block that is empty
for a node (no classes, no prefixes) is left out of that node's norm.
``cosine = sum_b w_b cos_b / sqrt(W_a W_b)`` over the blocks both hold
(``W``: the node's total weight of non-empty blocks).

*MinHash*: ``k = 64`` universal hashes ``h_i(x) = (a_i x + b_i) mod p``,
``p = 2^31 - 1`` (Mersenne prime; ``x`` reduced mod ``p`` first, so
``a_i x + b_i`` stays inside int64), ``a_i, b_i`` from a fixed seed; the
estimate's standard error is ``sqrt(J (1 - J) / k)`` (~0.06 at ``J = 0.5``).

Bounded: at most ``max_nodes`` nodes and ``max_hashes_per_node`` hashes per
node (:class:`CouplingError` beyond), ``k`` integers per node are kept, not
the sets.

Examples
--------
>>> g = build_graph([NodeInfo("a", "az-a", "m", prefix_hashes=range(100)),
...                  NodeInfo("b", "az-a", "m", prefix_hashes=range(100)),
...                  NodeInfo("c", "az-b", "m")])
>>> round(g.coupling("a", "b"), 3)  # d = 1 (identical prefixes), every block agrees
0.7
>>> round(g.coupling("a", "c"), 3)  # d = 2 (via the model); cosine 0.25 / sqrt(0.75 * 0.5)
0.363
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from controllers.errors import ParameterError, check_number
from core.vocab import DEFAULT_COUPLING_WEIGHTS

__all__ = [
    "CouplingError",
    "CouplingGraph",
    "CouplingParams",
    "NodeInfo",
    "build_graph",
    "minhash",
    "minhash_jaccard",
]

MERSENNE_P = (1 << 31) - 1
_MINHASH_SEED = 20250101  # fixed: signatures of two runs compare


class CouplingError(ParameterError):
    """Unusable coupling input (unknown node, NaN weight, over a bound); the message says which."""


@dataclass(frozen=True)
class CouplingParams:
    """Weights, edge strengths and bounds of the coupling graph (validated).

    Examples
    --------
    >>> CouplingParams().path_weight, CouplingParams().cosine_weight
    (0.6, 0.4)
    >>> CouplingParams(path_weight=0.5, cosine_weight=0.4)
    Traceback (most recent call last):
    ...
    controllers.coupling.CouplingError: path_weight + cosine_weight = 0.9: must be 1
    """

    path_weight: float = DEFAULT_COUPLING_WEIGHTS["path"]
    cosine_weight: float = DEFAULT_COUPLING_WEIGHTS["cosine"]
    zone_strength: float = 1.0
    model_strength: float = 1.0
    min_strength: float = 0.05
    embedding_weights: Mapping[str, float] = field(
        default_factory=lambda: {"model": 0.25, "zone": 0.25, "classes": 0.25, "prefix": 0.25}
    )
    minhash_k: int = 64
    max_nodes: int = 512
    max_hashes_per_node: int = 1_000_000

    def __post_init__(self) -> None:
        for name in ("path_weight", "cosine_weight"):
            if not 0.0 <= _check(name, getattr(self, name)) <= 1.0:
                raise CouplingError(f"{name}={getattr(self, name)}: must lie in [0, 1]")
        total = self.path_weight + self.cosine_weight
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            raise CouplingError(f"path_weight + cosine_weight = {total:g}: must be 1")
        for name in ("zone_strength", "model_strength"):
            if not 0.0 < _check(name, getattr(self, name)) <= 1.0:
                raise CouplingError(f"{name}={getattr(self, name)}: must lie in (0, 1]")
        if not 0.0 < _check("min_strength", self.min_strength) <= 1.0:
            raise CouplingError(f"min_strength={self.min_strength}: must lie in (0, 1]")
        ew = dict(self.embedding_weights)
        if set(ew) != {"model", "zone", "classes", "prefix"}:
            raise CouplingError(f"embedding_weights={ew!r}: keys must be model, zone, classes, prefix")
        for k, v in ew.items():
            if _check(f"embedding_weights[{k}]", v) < 0:
                raise CouplingError(f"embedding_weights[{k}]={v}: must be >= 0")
        if sum(ew.values()) <= 0:
            raise CouplingError("embedding_weights: at least one must be > 0")
        for name in ("minhash_k", "max_nodes", "max_hashes_per_node"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CouplingError(f"{name}={v!r}: must be an int >= 1")


def _check(name: str, value: object) -> float:
    try:
        return check_number(name, value)
    except ParameterError as exc:
        raise CouplingError(str(exc)) from None


@dataclass(frozen=True)
class NodeInfo:
    """What governor knows of one GPU node: ``class_mix`` is request class -> count or share."""

    node: str
    zone: str
    model: str
    class_mix: Mapping[str, float] = field(default_factory=dict)
    prefix_hashes: Iterable[int] = ()


def _perm(k: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(_MINHASH_SEED)
    a = rng.integers(1, MERSENNE_P, size=k, dtype=np.int64)
    b = rng.integers(0, MERSENNE_P, size=k, dtype=np.int64)
    return a, b


def minhash(hashes: Iterable[int], k: int = 64) -> np.ndarray | None:
    """The ``k``-slot MinHash signature of a set of ints (None for the empty set).

    >>> s = minhash(range(10))
    >>> s.shape, bool((minhash([9, 3, 0, 1, 2, 4, 5, 6, 7, 8]) == s).all())
    ((64,), True)
    >>> minhash([]) is None
    True
    """
    xs = np.fromiter((int(h) % MERSENNE_P for h in hashes), dtype=np.int64)
    if xs.size == 0:
        return None
    xs = np.unique(xs)
    a, b = _perm(k)
    sig = np.full(k, MERSENNE_P, dtype=np.int64)
    for lo in range(0, xs.size, 4096):  # chunks keep the (k, chunk) block small
        chunk = xs[lo : lo + 4096]
        sig = np.minimum(sig, ((a[:, None] * chunk[None, :] + b[:, None]) % MERSENNE_P).min(axis=1))
    return sig


def minhash_jaccard(sig_a: np.ndarray | None, sig_b: np.ndarray | None) -> float:
    """Share of agreeing slots: the MinHash estimate of the Jaccard similarity (0 if either is empty).

    >>> minhash_jaccard(minhash(range(100)), minhash(range(100)))
    1.0
    """
    if sig_a is None or sig_b is None:
        return 0.0
    return float(np.mean(sig_a == sig_b))


def _unit(mix: Mapping[str, float]) -> dict[str, float]:
    norm = math.sqrt(sum(v * v for v in mix.values()))
    return {k: v / norm for k, v in mix.items()} if norm > 0 else {}


@dataclass(frozen=True)
class _Embedding:
    model: str
    zone: str
    classes: dict[str, float]  # unit-normalised class mix ({} = none)
    signature: np.ndarray | None


class CouplingGraph:
    """The graph, the nodes' embeddings and the coupling of two nodes (see the module docstring)."""

    def __init__(self, graph: nx.Graph, embeddings: dict[str, _Embedding], params: CouplingParams) -> None:
        self.graph, self.embeddings, self.params = graph, embeddings, params
        self._dist: dict[str, dict[str, float]] = {}

    @property
    def nodes(self) -> list[str]:
        """The GPU nodes, in input order."""
        return list(self.embeddings)

    def _known(self, node: str) -> None:
        if node not in self.embeddings:
            raise CouplingError(f"node {node!r}: not in the coupling graph")

    def distance(self, a: str, b: str) -> float:
        """Weighted shortest-path length between nodes ``a`` and ``b`` (inf: not connected)."""
        self._known(a)
        self._known(b)
        if a not in self._dist:
            self._dist[a] = nx.single_source_dijkstra_path_length(self.graph, f"node:{a}", weight="length")
        return float(self._dist[a].get(f"node:{b}", math.inf))

    def cosine(self, a: str, b: str) -> float:
        """Cosine of the two nodes' block embeddings (0 when either has no non-empty block)."""
        self._known(a)
        self._known(b)
        ea, eb, w = self.embeddings[a], self.embeddings[b], self.params.embedding_weights
        blocks_a = {"model": 1.0, "zone": 1.0}
        blocks_b = dict(blocks_a)
        if ea.classes:
            blocks_a["classes"] = 1.0
        if eb.classes:
            blocks_b["classes"] = 1.0
        if ea.signature is not None:
            blocks_a["prefix"] = 1.0
        if eb.signature is not None:
            blocks_b["prefix"] = 1.0
        wa = sum(w[k] for k in blocks_a)
        wb = sum(w[k] for k in blocks_b)
        if wa <= 0 or wb <= 0:
            return 0.0
        dot = w["model"] * (ea.model == eb.model) + w["zone"] * (ea.zone == eb.zone)
        dot += w["classes"] * sum(v * eb.classes.get(c, 0.0) for c, v in ea.classes.items())
        dot += w["prefix"] * minhash_jaccard(ea.signature, eb.signature)
        return min(1.0, dot / math.sqrt(wa * wb))

    def coupling(self, a: str, b: str) -> float:
        """``w_path / (1 + d(a, b)) + w_cos * cosine(a, b)``, in [0, 1]; 1 for ``a == b``."""
        if a == b:
            self._known(a)
            return 1.0
        p = self.params
        d = self.distance(a, b)
        path = 0.0 if math.isinf(d) else 1.0 / (1.0 + d)
        return p.path_weight * path + p.cosine_weight * self.cosine(a, b)

    def top_pairs(self, n: int = 10) -> list[tuple[str, str, float]]:
        """The ``n`` most coupled node pairs (ties: input order), highest first."""
        nodes = self.nodes
        pairs = [(a, b, self.coupling(a, b)) for i, a in enumerate(nodes) for b in nodes[i + 1 :]]
        pairs.sort(key=lambda t: -t[2])  # stable: ties keep input order
        return pairs[: max(0, int(n))]

    def prefix_edges(self) -> list[tuple[str, str, float]]:
        """Node -- node prefix-sharing edges with their strength (the Jaccard estimate)."""
        out = []
        for u, v, data in self.graph.edges(data=True):
            if data.get("kind") == "prefix":
                out.append((u.removeprefix("node:"), v.removeprefix("node:"), float(data["strength"])))
        return out

    def summary(self) -> dict[str, Any]:
        """Counts of vertices and edges by kind (plain data)."""
        kinds: dict[str, int] = {}
        for _, _, data in self.graph.edges(data=True):
            kinds[data["kind"]] = kinds.get(data["kind"], 0) + 1
        return {
            "nodes": len(self.embeddings),
            "vertices": self.graph.number_of_nodes(),
            "edges": dict(sorted(kinds.items())),
            "path_weight": self.params.path_weight,
            "cosine_weight": self.params.cosine_weight,
        }


def _add_edge(g: nx.Graph, u: str, v: str, strength: float, kind: str) -> None:
    g.add_edge(u, v, strength=strength, length=1.0 / strength, kind=kind)


def build_graph(nodes: Sequence[NodeInfo], params: CouplingParams | None = None) -> CouplingGraph:
    """The coupling graph of ``nodes`` (see the module docstring); :class:`CouplingError` on bad input.

    >>> build_graph([NodeInfo("a", "z", "m", class_mix={"chat": float("nan")})])
    Traceback (most recent call last):
    ...
    controllers.coupling.CouplingError: node 'a': class_mix['chat']=nan: must be a finite number >= 0
    """
    p = params or CouplingParams()
    if len(nodes) > p.max_nodes:
        raise CouplingError(f"{len(nodes)} nodes: more than max_nodes={p.max_nodes}")
    g = nx.Graph()
    emb: dict[str, _Embedding] = {}
    for info in nodes:
        name = info.node
        for label in ("node", "zone", "model"):
            v = getattr(info, label)
            if not isinstance(v, str) or not v:
                raise CouplingError(f"node {name!r}: {label}={v!r}: must be a non-empty string")
        if name in emb:
            raise CouplingError(f"node {name!r}: listed twice")
        mix: dict[str, float] = {}
        for c, v in dict(info.class_mix).items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise CouplingError(f"node {name!r}: class_mix[{c!r}]={v!r}: must be a finite number >= 0")
            if not isinstance(c, str) or not c:
                raise CouplingError(f"node {name!r}: class_mix key {c!r}: must be a non-empty string")
            mix[c] = float(v)
        hashes = list(info.prefix_hashes)
        if len(hashes) > p.max_hashes_per_node:
            raise CouplingError(f"node {name!r}: {len(hashes)} prefix hashes, more than {p.max_hashes_per_node}")
        if any(isinstance(h, bool) or not isinstance(h, int | np.integer) for h in hashes):
            raise CouplingError(f"node {name!r}: prefix_hashes must be integers")
        sig = minhash(hashes, p.minhash_k)
        emb[name] = _Embedding(info.model, info.zone, _unit(mix), sig)
        vn = f"node:{name}"
        g.add_node(vn, kind="node")
        g.add_node(f"zone:{info.zone}", kind="zone")
        g.add_node(f"model:{info.model}", kind="model")
        _add_edge(g, vn, f"zone:{info.zone}", p.zone_strength, "zone")
        _add_edge(g, vn, f"model:{info.model}", p.model_strength, "model")
        total = sum(mix.values())
        for c, v in mix.items():
            share = v / total if total > 0 else 0.0
            if share >= p.min_strength:
                g.add_node(f"class:{c}", kind="class")
                _add_edge(g, vn, f"class:{c}", share, "class")
    names = [n for n in emb if emb[n].signature is not None]
    if names:
        sigs = np.stack([emb[n].signature for n in names])  # type: ignore[misc]
        for i, a in enumerate(names[:-1]):
            agree = (sigs[i + 1 :] == sigs[i]).mean(axis=1)
            for j in np.nonzero(agree >= p.min_strength)[0]:
                _add_edge(g, f"node:{a}", f"node:{names[i + 1 + int(j)]}", float(agree[j]), "prefix")
    return CouplingGraph(g, emb, p)
