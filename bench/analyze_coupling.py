"""``governor analyze coupling``: the resource-semantics coupling graph of a fleet (docs/model.md (coupling)).

The topology comes from one of:

- a trace (``--trace``, default ``mooncake``: its requests carry the
  prefix-block ``hash_ids``): the first ``--duration-s`` seconds are replayed
  through the fast simulator (:mod:`sim.fastloop`, a static fleet of
  ``--replicas`` per zone of the settings' zones, first model), so every
  request lands on the node the simulator gives it; a node's prefix hashes
  and request-class mix are those of the requests it served;
- a JSON file (``--topology``): ``{"nodes": [{"node", "zone", "model",
  "class_mix": {class: count}, "prefix_hashes": [int, ...]}, ...]}``.

It prints the graph's summary and the ``--top`` most coupled node pairs
(coupling, weighted path length, embedding cosine, MinHash Jaccard estimate
of their prefix sets); ``--json`` prints the same as one object; ``--png``
draws the graph (nodes by kind, prefix edges by strength). Exit 2 on bad
input (unreadable file, malformed topology, bad weights).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from controllers.coupling import CouplingError, CouplingGraph, CouplingParams, NodeInfo, build_graph, minhash_jaccard

__all__ = ["add_parser", "from_trace", "load_topology", "run"]

MAX_TOPOLOGY_BYTES = 64 << 20


class TopologyError(ValueError):
    """The topology file is unusable; the message says where and why."""


def add_parser(asub: Any) -> None:
    """Register ``coupling`` under ``governor analyze``."""
    p = asub.add_parser("coupling", help="coupling graph of the fleet's nodes (KV prefix sharing, zones, models)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--topology", type=Path, help="JSON topology file (see the module docstring)")
    src.add_argument("--trace", default="mooncake", help="trace name or file replayed to place requests on nodes")
    p.add_argument("--duration-s", type=float, default=120.0, help="trace seconds replayed (with --trace)")
    p.add_argument("--qps", type=float, default=None, help="replay rate (default: the trace's own mean rate)")
    p.add_argument("--replicas", type=int, default=4, help="replicas per zone (with --trace)")
    p.add_argument("--path-weight", type=float, default=None, help="weight of 1/(1+path); default 0.6")
    p.add_argument("--cosine-weight", type=float, default=None, help="weight of the embedding cosine; default 0.4")
    p.add_argument("--top", type=int, default=10, help="pairs printed")
    p.add_argument("--png", type=Path, default=None, help="draw the graph to this PNG file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _params(args: argparse.Namespace) -> CouplingParams:
    pw, cw = args.path_weight, args.cosine_weight
    if pw is None and cw is None:
        return CouplingParams()
    if pw is None:
        pw = 1.0 - cw
    if cw is None:
        cw = 1.0 - pw
    return CouplingParams(path_weight=pw, cosine_weight=cw)


def load_topology(path: Path) -> list[NodeInfo]:
    """The nodes of a JSON topology file; :class:`TopologyError` names what is wrong."""
    try:
        if path.stat().st_size > MAX_TOPOLOGY_BYTES:
            raise TopologyError(f"{path}: larger than {MAX_TOPOLOGY_BYTES} bytes")
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TopologyError(f"{path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise TopologyError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or not data["nodes"]:
        raise TopologyError(f"{path}: want an object with a non-empty list 'nodes'")
    out = []
    for i, item in enumerate(data["nodes"]):
        if not isinstance(item, dict):
            raise TopologyError(f"{path}: nodes[{i}]: want an object")
        unknown = set(item) - {"node", "zone", "model", "class_mix", "prefix_hashes"}
        if unknown:
            raise TopologyError(f"{path}: nodes[{i}]: unknown keys {sorted(unknown)}")
        mix, hashes = item.get("class_mix", {}), item.get("prefix_hashes", [])
        if not isinstance(mix, dict) or not isinstance(hashes, list):
            raise TopologyError(f"{path}: nodes[{i}]: class_mix must be an object, prefix_hashes a list")
        out.append(NodeInfo(item.get("node"), item.get("zone"), item.get("model"), mix, hashes))  # type: ignore[arg-type]
    return out


def from_trace(
    settings: Any, trace: str, duration_s: float, qps: float | None, replicas: int
) -> tuple[list[NodeInfo], str]:
    """Replay ``trace`` through the fast simulator and return each node's requests' prefixes and classes."""
    from sim.baselines.static import StaticParams, StaticReplicas
    from sim.fastloop import LoopConfig
    from sim.fastloop import run as run_loop
    from sim.traces import load_trace
    from sim.workloads import from_trace as workload_from_trace

    tr = load_trace(trace)
    rate = qps if qps is not None else tr.mean_qps
    wl = workload_from_trace(tr, rate, duration_s)
    spec = settings.models[0]
    cfg = LoopConfig.of(model=spec.name, zones=tuple(settings.zones), initial_replicas=replicas, max_replicas=replicas)
    res = run_loop(lambda z: StaticReplicas(StaticParams(replicas=replicas)), wl, cfg, duration_s=duration_s)
    hashes: dict[str, set[int]] = defaultdict(set)
    classes: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    where: dict[str, tuple[str, str]] = {}
    for rec in res.finished:
        node = rec["node"]
        where[node] = (rec["zone"], rec["model"])
        classes[node][rec.get("request_class") or "default"] += 1.0
        i = int(str(rec["request_id"]).removeprefix("r"))
        if wl.hash_ids is not None:
            hashes[node].update(wl.hash_ids[i])
    nodes = [NodeInfo(n, z, m, dict(classes[n]), sorted(hashes[n])) for n, (z, m) in sorted(where.items())]
    return nodes, f"{tr.name}: {len(res.finished)} requests, {duration_s:g} s at {rate:.3g} req/s"


def report(g: CouplingGraph, top: int) -> dict[str, Any]:
    """Summary and the top pairs as plain data."""
    pairs = []
    for a, b, c in g.top_pairs(top):
        sa, sb = g.embeddings[a].signature, g.embeddings[b].signature
        pairs.append(
            {
                "a": a,
                "b": b,
                "coupling": round(c, 4),
                "path": round(g.distance(a, b), 4),
                "cosine": round(g.cosine(a, b), 4),
                "prefix_jaccard": round(minhash_jaccard(sa, sb), 4),
            }
        )
    return {"summary": g.summary(), "top_pairs": pairs}


def draw(g: CouplingGraph, path: Path) -> None:
    """The graph as a PNG: nodes coloured by kind, prefix edges wider with strength."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    colours = {"node": "#4c72b0", "zone": "#dd8452", "model": "#55a868", "class": "#c44e52"}
    graph = g.graph
    pos = nx.spring_layout(graph, seed=0, weight="strength")
    fig, ax = plt.subplots(figsize=(9, 7))
    for kind, colour in colours.items():
        vs = [v for v, d in graph.nodes(data=True) if d.get("kind") == kind]
        nx.draw_networkx_nodes(graph, pos, nodelist=vs, node_color=colour, node_size=220, label=kind, ax=ax)
    plain = [(u, v) for u, v, d in graph.edges(data=True) if d["kind"] != "prefix"]
    prefix = [(u, v, d["strength"]) for u, v, d in graph.edges(data=True) if d["kind"] == "prefix"]
    nx.draw_networkx_edges(graph, pos, edgelist=plain, edge_color="#999999", width=0.8, ax=ax)
    if prefix:
        nx.draw_networkx_edges(
            graph,
            pos,
            edgelist=[(u, v) for u, v, _ in prefix],
            width=[0.5 + 5.0 * s for _, _, s in prefix],
            edge_color="#8172b3",
            ax=ax,
        )
    nx.draw_networkx_labels(graph, pos, labels={v: v.split(":", 1)[1] for v in graph.nodes}, font_size=6, ax=ax)
    s = g.summary()
    ax.set_title(f"coupling graph: {s['nodes']} nodes, edges {s['edges']} (purple width: prefix Jaccard)")
    ax.legend(loc="best", fontsize=8)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(settings: Any, args: argparse.Namespace) -> int:
    """Build, print and draw; 2 on bad input."""
    from sim.traces import TraceError
    from sim.workloads import WorkloadError

    try:
        if args.top < 0 or not 0 < args.duration_s <= 3600:
            raise TopologyError("--top must be >= 0 and --duration-s in (0, 3600]")
        params = _params(args)
        if args.topology is None and not 1 <= args.replicas * len(settings.zones) <= params.max_nodes:
            raise TopologyError(f"--replicas x zones must lie in [1, {params.max_nodes}] (the graph's node bound)")
        if args.topology is not None:
            nodes, source = load_topology(args.topology), str(args.topology)
        else:
            nodes, source = from_trace(settings, args.trace, args.duration_s, args.qps, args.replicas)
        if not nodes:
            raise TopologyError(f"{source}: no nodes")
        g = build_graph(nodes, params)
    except (TopologyError, CouplingError, TraceError, WorkloadError) as exc:
        print(f"governor analyze coupling: {exc}", file=sys.stderr)
        return 2
    out = {"source": source, **report(g, args.top)}
    if args.png is not None:
        try:
            draw(g, args.png)
        except OSError as exc:
            print(f"governor analyze coupling: cannot write {args.png}: {exc}", file=sys.stderr)
            return 2
        out["png"] = str(args.png)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    s = out["summary"]
    print(f"coupling graph of {source}")
    print(
        f"  {s['nodes']} nodes, {s['vertices']} vertices, edges {s['edges']}; "
        f"coupling = {s['path_weight']:g} / (1 + path) + {s['cosine_weight']:g} cosine"
    )
    print(f"  {'a':<24} {'b':<24} {'coupling':>8} {'path':>6} {'cosine':>6} {'prefix J':>8}")
    for p in out["top_pairs"]:
        print(
            f"  {p['a']:<24} {p['b']:<24} {p['coupling']:>8.4f} {p['path']:>6.2f} "
            f"{p['cosine']:>6.3f} {p['prefix_jaccard']:>8.3f}"
        )
    if args.png is not None:
        print(f"  graph drawn to {args.png}")
    return 0
