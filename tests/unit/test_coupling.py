"""Coupling graph (controllers/coupling.py, docs/model.md (coupling)): hand-worked values, MinHash
against exact Jaccard, hostile input, the session-move preference in the fleet, and the CLI."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from controllers.coupling import (
    CouplingError,
    CouplingParams,
    NodeInfo,
    build_graph,
    minhash,
    minhash_jaccard,
)
from governor.cli import main
from sim.fleet import Fleet, FleetConfig
from sim.perf_model import PerfModel

pytestmark = pytest.mark.timeout(60)

M = "llama2-70b"
PM = PerfModel.from_splitwise()
BLOCK_B = 512 * PM.kv_bytes_per_token


def tiny() -> list[NodeInfo]:
    # a and b: same zone and model, identical prefix sets (MinHash J = 1 exactly);
    # c: another zone, same model, a disjoint prefix set (J = 0 exactly: the hashes are bijections mod p).
    return [
        NodeInfo("a", "az-a", "m1", {"chat": 3, "batch": 4}, range(1, 11)),
        NodeInfo("b", "az-a", "m1", {"chat": 1}, range(1, 11)),
        NodeInfo("c", "az-b", "m1", {}, range(100, 110)),
    ]


def test_coupling_by_hand_on_a_tiny_graph() -> None:
    g = build_graph(tiny())
    # Paths: a -- b by the prefix edge (strength 1, length 1); a, b -- c only through model:m1 (1 + 1).
    assert g.distance("a", "b") == pytest.approx(1.0)
    assert g.distance("a", "c") == pytest.approx(2.0) and g.distance("b", "c") == pytest.approx(2.0)
    # a's class mix (3, 4) has unit vector (0.6, 0.8); b's is (1, 0): class cosine 0.6.
    # a and b hold every block (weights 1/4 each): cosine = (1 + 1 + 0.6 + 1) / 4 = 0.9.
    assert g.cosine("a", "b") == pytest.approx(0.9)
    # c holds model, zone and prefix blocks (W = 0.75); only the model agrees: 0.25 / sqrt(1 * 0.75).
    assert g.cosine("a", "c") == pytest.approx(0.25 / math.sqrt(0.75))
    assert g.coupling("a", "b") == pytest.approx(0.6 / 2 + 0.4 * 0.9)  # 0.66
    assert g.coupling("a", "c") == pytest.approx(0.6 / 3 + 0.4 * 0.25 / math.sqrt(0.75))
    assert g.coupling("a", "a") == 1.0
    assert g.coupling("a", "b") == pytest.approx(g.coupling("b", "a"))
    # Other weights: 0.5 / 0.5.
    g5 = build_graph(tiny(), CouplingParams(path_weight=0.5, cosine_weight=0.5))
    assert g5.coupling("a", "b") == pytest.approx(0.5 / 2 + 0.5 * 0.9)
    assert [(a, b) for a, b, _ in g.top_pairs(1)] == [("a", "b")]
    assert g.summary()["edges"] == {"class": 3, "model": 3, "prefix": 1, "zone": 3}


def test_class_edges_shorten_paths_and_disconnected_nodes_have_no_path_term() -> None:
    p = CouplingParams()
    # Two nodes sharing only a request class (strength 1 each) are 2 apart through it;
    # they share no zone or model, so nothing else connects them.
    g = build_graph([NodeInfo("x", "z1", "m1", {"chat": 1}), NodeInfo("y", "z2", "m2", {"chat": 1})], p)
    assert g.distance("x", "y") == pytest.approx(2.0)
    g2 = build_graph([NodeInfo("x", "z1", "m1"), NodeInfo("y", "z2", "m2")], p)
    assert math.isinf(g2.distance("x", "y"))
    assert g2.coupling("x", "y") == 0.0  # no path, no agreeing block


@pytest.mark.parametrize("overlap", [0.1, 1 / 3, 0.5, 0.8])
def test_minhash_estimates_the_exact_jaccard(overlap: float) -> None:
    rng = np.random.default_rng(7)
    pool = rng.choice(10**9, size=3000, replace=False)
    n = 800
    shared = int(round(2 * n * overlap / (1 + overlap)))  # |A & B| / |A | B| = overlap
    a = set(pool[:n].tolist())
    b = set(pool[:shared].tolist()) | set(pool[n : 2 * n - shared].tolist())
    exact = len(a & b) / len(a | b)
    est = minhash_jaccard(minhash(a), minhash(b))
    se = math.sqrt(exact * (1 - exact) / 64)
    assert abs(est - exact) <= 3.5 * se + 1e-12, (est, exact)


def test_minhash_error_over_many_pairs_is_small_on_average() -> None:
    rng = np.random.default_rng(11)
    errs = []
    for _ in range(40):
        a = set(rng.integers(0, 400, 150).tolist())
        b = set(rng.integers(0, 400, 150).tolist())
        errs.append(minhash_jaccard(minhash(a), minhash(b)) - len(a & b) / len(a | b))
    assert abs(float(np.mean(errs))) < 0.03 and float(np.mean(np.abs(errs))) < 0.06


@pytest.mark.parametrize(
    ("make", "msg"),
    [
        (lambda: CouplingParams(path_weight=float("nan"), cosine_weight=0.4), "path_weight=nan"),
        (lambda: CouplingParams(path_weight=0.7, cosine_weight=0.4), "must be 1"),
        (lambda: CouplingParams(embedding_weights={"model": 1.0}), "keys must be"),
        (lambda: build_graph([NodeInfo("a", "z", "m", {"c": float("nan")})]), "class_mix"),
        (lambda: build_graph([NodeInfo("a", "z", "m", {"c": -1.0})]), "class_mix"),
        (lambda: build_graph([NodeInfo("a", "z", "m"), NodeInfo("a", "z", "m")]), "listed twice"),
        (lambda: build_graph([NodeInfo("a", "", "m")]), "zone"),
        (lambda: build_graph([NodeInfo("a", "z", "m", prefix_hashes=["x"])]), "integers"),  # type: ignore[list-item]
        (
            lambda: build_graph([NodeInfo(f"n{i}", "z", "m") for i in range(3)], CouplingParams(max_nodes=2)),
            "max_nodes",
        ),
        (lambda: build_graph(tiny()).coupling("a", "nope"), "not in the coupling graph"),
    ],
)
def test_hostile_input_is_a_clear_error(make: Callable[[], object], msg: str) -> None:
    with pytest.raises(CouplingError, match=msg):
        make()


# -- where it matters: session moves prefer the peer coupled with the source -------------------------
def _fleet_with_a_waiting_request() -> tuple[Fleet, str]:
    """r0 holds prefixes 101 and 103 and has d (6 blocks) waiting; r1 and r2 are empty, ready peers."""
    f = Fleet(
        FleetConfig(
            models={M: PM},
            initial_replicas=1,
            jitter=False,
            context_aware_decode=False,
            kv_allocator="contiguous",
            kv_capacity_tokens=10 * 512,
            startup_s=0.0,
        ),
        epoch_ms0=0,
    )
    for rid, out, h in (("a", 512, [101]), ("b", 10, [102]), ("c", 512, [103])):
        f.submit(0.0, "az-a", M, 512, out, rid, hash_ids=h)
    f.advance_to(3.0)
    f.submit(3.0, "az-a", M, 2048, 1024, "d", hash_ids=[201, 202, 203, 204])
    f.advance_to(3.5)
    f.set_desired("az-a", M, 3, 3.5)
    f.advance_to(3.6)
    return f, f"az-a/{M}/r0"


def _peer(f: Fleet, i: int) -> Any:
    return f._replica("az-a", M, f"az-a/{M}/r{i}")


def test_session_move_prefers_the_coupled_peer_and_without_coupling_keeps_the_old_choice() -> None:
    # Two otherwise equal peers: one block each in use, none of d's blocks, no outstanding tokens.
    # r2 holds a prefix block the source holds (101): it is coupled with r0; r1's block (999) is not.
    f, src = _fleet_with_a_waiting_request()
    _peer(f, 1).kv.alloc("x1", BLOCK_B, hash_ids=[999])
    _peer(f, 2).kv.alloc("x2", BLOCK_B, hash_ids=[101])
    assert _peer(f, 1).outstanding == _peer(f, 2).outstanding
    out = f.move_sessions("az-a", M, src, 3.6)
    assert out["moved"] == {"d": f"az-a/{M}/r2"}
    # Coupling off: the old key (resident blocks of d, then least outstanding, then order) picks r1.
    f, src = _fleet_with_a_waiting_request()
    _peer(f, 1).kv.alloc("x1", BLOCK_B, hash_ids=[999])
    _peer(f, 2).kv.alloc("x2", BLOCK_B, hash_ids=[101])
    assert f.move_sessions("az-a", M, src, 3.6, coupling=None)["moved"] == {"d": f"az-a/{M}/r1"}


def test_session_move_still_prefers_the_peer_holding_the_requests_own_blocks() -> None:
    # r1 holds one of d's own blocks (201): that beats r2's coupling with the source.
    f, src = _fleet_with_a_waiting_request()
    _peer(f, 1).kv.alloc("x1", BLOCK_B, hash_ids=[201])
    _peer(f, 2).kv.alloc("x2", BLOCK_B, hash_ids=[101])
    assert f.move_sessions("az-a", M, src, 3.6)["moved"] == {"d": f"az-a/{M}/r1"}


# -- governor analyze coupling ------------------------------------------------------------------------
def test_cli_from_a_topology_file_prints_pairs_and_draws(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo = tmp_path / "topo.json"
    nodes = [
        {
            "node": n.node,
            "zone": n.zone,
            "model": n.model,
            "class_mix": dict(n.class_mix),
            "prefix_hashes": list(n.prefix_hashes),
        }
        for n in tiny()
    ]
    topo.write_text(json.dumps({"nodes": nodes}))
    png = tmp_path / "g.png"
    assert main(["analyze", "coupling", "--topology", str(topo), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "3 nodes" in out and "0.6600" in out  # a -- b, worked by hand above
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert main(["analyze", "coupling", "--topology", str(topo), "--json", "--path-weight", "0.5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["top_pairs"][0]["coupling"] == pytest.approx(0.5 / 2 + 0.5 * 0.9, abs=1e-4)


def test_cli_from_the_mooncake_trace_places_requests_on_the_simulators_nodes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["analyze", "coupling", "--duration-s", "20", "--replicas", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["nodes"] == 4  # 2 zones x 2 replicas, each served requests
    assert data["source"].startswith("mooncake")
    assert all(0.0 <= p["coupling"] <= 1.0 for p in data["top_pairs"])


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"nodes": []}),
        json.dumps({"nodes": [{"node": "a", "zone": "z", "model": "m", "class_mix": {"c": "NaN"}}]}),
        '{"nodes": [{"node": "a", "zone": "z", "model": "m", "class_mix": {"c": NaN}}]}',
        json.dumps({"nodes": [{"node": "a", "zone": "z", "model": "m", "colour": "red"}]}),
        json.dumps({"nodes": [{"node": "a", "zone": "z"}]}),
    ],
)
def test_cli_exits_2_on_bad_input(tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]) -> None:
    topo = tmp_path / "topo.json"
    topo.write_text(content)
    assert main(["analyze", "coupling", "--topology", str(topo)]) == 2
    assert "governor analyze coupling:" in capsys.readouterr().err


def test_cli_exits_2_on_missing_file_bad_trace_and_bad_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", "coupling", "--topology", str(tmp_path / "none.json")]) == 2
    assert main(["analyze", "coupling", "--trace", str(tmp_path / "none.jsonl")]) == 2
    assert main(["analyze", "coupling", "--replicas", "1000"]) == 2  # over the node bound, refused before running
    assert main(["analyze", "coupling", "--duration-s", "0"]) == 2
    topo = tmp_path / "t.json"
    topo.write_text(json.dumps({"nodes": [{"node": "a", "zone": "z", "model": "m"}]}))
    assert main(["analyze", "coupling", "--topology", str(topo), "--path-weight", "nan"]) == 2
    assert main(["analyze", "coupling", "--topology", str(topo), "--path-weight", "0.7", "--cosine-weight", "0.7"]) == 2
