"""MIB's circuits when edge scores tie, against hannamw/EAP-IG's own ranking (`Graph.apply_topn`, `prune`).

EAP-IG ranks the edges with `torch.argsort(scores.view(-1), descending=True)` over its float32
[n_forward, n_backward] score matrix (-inf where no edge), an unstable sort: where scores tie (a
node-level method's scores given to edges, each edge its writer's score, as MIB's node rows and the
docs' atp_ig row are), the edges it keeps at a fraction are not the first ones in the graph's order.
hookrun took ties in the graph's order (numpy's stable argsort): on this 2-layer graph with each edge
its writer's score, MIB's 20% circuit (22 edges, signed) pruned to 1 edge, hookrun's to 14, and the
faithfulness there and the CPR differed. The reference below is EAP-IG's code transcribed (its index
scheme, real-edge mask, `apply_topn(level='edge')` and `prune`), with no hookrun code; the ablation is
test_mib_metrics' TransformerLens reference.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from edge_graph import prompt_pairs
from test_mib_metrics import MIB, H, L, V, ablated_metric, metric
from tl_models import hooked_transformer

import hookrun
from hookrun.runner.kinds.patching.edges.graph import Graph
from hookrun.runner.kinds.patching.edges.mib import mib_circuit


class EapIgGraph:
    """hannamw/EAP-IG's Graph.from_model (non-parallel) as tensors: forward / backward indices, real edges."""

    def __init__(self, n_layers: int, n_heads: int):
        self.L, self.H = n_layers, n_heads
        self.n_forward, self.n_backward = 1 + n_layers * (n_heads + 1), n_layers * (3 * n_heads + 1) + 1
        self.real = torch.zeros(self.n_forward, self.n_backward, dtype=torch.bool)
        self.f2b = torch.zeros(self.n_forward, self.n_backward, dtype=torch.bool)
        self.names: dict = {}
        residual = ["input"]
        for layer in range(n_layers):
            heads = [f"a{layer}.h{h}" for h in range(n_heads)]
            for a in heads:
                for q in "qkv":
                    self.f2b[self.fwd(a), self.bwd(a, q)] = True
            self.f2b[self.fwd(f"m{layer}"), self.bwd(f"m{layer}")] = True
            for p in residual:
                for a in heads:
                    for q in "qkv":
                        self.add(p, a, q)
            residual += heads
            for p in residual:
                self.add(p, f"m{layer}")
            residual.append(f"m{layer}")
        for p in residual:
            self.add(p, "logits")

    def fwd(self, name):
        if name == "input":
            return 0
        if name[0] == "m":
            return 1 + int(name[1:]) * (self.H + 1) + self.H
        layer, head = (int(x) for x in name[1:].split(".h"))
        return 1 + layer * (self.H + 1) + head

    def bwd(self, name, qkv=None):
        if name == "logits":
            return self.n_backward - 1
        if name[0] == "m":
            return int(name[1:]) * (3 * self.H + 1) + 3 * self.H
        layer, head = (int(x) for x in name[1:].split(".h"))
        return layer * (3 * self.H + 1) + "qkv".index(qkv) * self.H + head

    def add(self, p, c, q=None):
        self.real[self.fwd(p), self.bwd(c, q)] = True
        self.names[(self.fwd(p), self.bwd(c, q))] = (p, c, q)

    def apply_topn(self, scores: torch.Tensor, n: int, absolute: bool) -> torch.Tensor:
        """EAP-IG's apply_topn(n, absolute, level='edge', prune=True): the kept [n_forward, n_backward] edges."""
        edge_scores = scores.clone()
        if absolute:
            edge_scores = torch.abs(edge_scores)
        edge_scores[~self.real] = -torch.inf
        in_graph = torch.zeros_like(self.real)
        sorted_edges = torch.argsort(edge_scores.view(-1), descending=True)
        in_graph.view(-1)[sorted_edges[:n]] = True
        nodes = torch.zeros(self.n_forward, dtype=torch.bool)
        while True:  # prune
            outgoing = in_graph.any(dim=1)
            ingoing = (in_graph.any(dim=0).float() @ self.f2b.float().T) > 0
            ingoing[0] = True
            old_nodes, old_edges = nodes.clone(), in_graph.clone()
            nodes = outgoing & ingoing
            backward = nodes.float() @ self.f2b.float()
            backward[-1] = 1
            in_graph = in_graph & ((nodes.float()[:, None] * backward[None]) > 0)
            if torch.equal(old_nodes, nodes) and torch.equal(old_edges, in_graph):
                return in_graph


def tied(g: EapIgGraph, seed: int) -> torch.Tensor:
    """Each edge its writer's score (rounded, as a node-level method's table would give them): float32, as EAP-IG's."""
    node = torch.tensor(np.round(np.random.default_rng(seed).normal(size=g.n_forward), 3), dtype=torch.float32)
    return torch.where(g.real, node[:, None], torch.zeros(()))


def hookrun_grid(g: EapIgGraph, scores: torch.Tensor, graph: Graph) -> np.ndarray:
    """The same scores on hookrun's [writers, readers] grid, placed by EAP-IG's names (NaN where no edge)."""
    def writer(n):
        return "embed" if n == "input" else f"L{n[1:]}.MLP" if n[0] == "m" else "L{}.H{}".format(*n[1:].split(".h"))

    def reader(c, q):
        return "logits" if c == "logits" else writer(c) + (f".{q}" if q else "")
    out = np.full(graph.mask.shape, np.nan)
    for (i, j), (p, c, q) in g.names.items():
        out[graph.writers.index(writer(p)), graph.readers.index(reader(c, q))] = float(scores[i, j])
    return out


@pytest.mark.parametrize(("n_layers", "n_heads", "seed"), [(2, 4, 7), (2, 4, 14), (12, 12, 0)])
def test_tied_scores_give_eap_igs_circuits(n_layers, n_heads, seed):
    g, graph = EapIgGraph(n_layers, n_heads), Graph(n_layers, n_heads)
    scores = tied(g, seed)
    grid = hookrun_grid(g, scores, graph)
    assert int(g.real.sum()) == graph.edges
    for f in MIB:
        for absolute in (False, True):
            want = g.apply_topn(scores, int(f * graph.edges), absolute)
            got = mib_circuit(graph, grid, int(f * graph.edges), absolute)
            kept = {g.names[ij] for ij in map(tuple, want.nonzero().tolist())}
            assert int(got.sum()) == len(kept), (f, absolute)
            assert hookrun_grid(g, want.float(), graph)[got].all(), (f, absolute)


def test_tied_circuit_file_scores_mibs_curve():
    """faithfulness.from an EAP-IG JSON with tied scores: each fraction's circuit and faithfulness as MIB's."""
    model = hooked_transformer(V, n_layers=L, d_model=16, n_ctx=8, d_head=4, n_heads=H, act_fn="gelu", seed=3)
    items = prompt_pairs(V, 6, seed=5, at=1, shift=11)
    g = EapIgGraph(L, H)
    scores = tied(g, 7)
    doc = {"cfg": {"n_layers": L, "n_heads": H, "parallel_attn_mlp": False, "d_model": 16},
           "nodes": {n: {"in_graph": True} for n in ["input", *(f"a{i}.h{h}" for i in range(L) for h in range(H)),
                                                      *(f"m{i}" for i in range(L)), "logits"]},
           "edges": {f"{p}->{c}" + (f"<{q}>" if q else ""): {"score": float(scores[ij]), "in_graph": True}
                     for ij, (p, c, q) in g.names.items()}}
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tied.json"
        path.write_text(json.dumps(doc))
        grid = hookrun.patch_grid(model, items, input="input", method="eap",
                                  faithfulness={"fractions": "mib", "from": str(path)})["edges"]
    with torch.no_grad():
        clean = float(np.mean([metric(model(it["clean"][None]), it) for it in items]))
    empty = ablated_metric(model, items, set())
    n = int(g.real.sum())
    for name, absolute in (("cpr", False), ("cmd", True)):
        circuits = [{g.names[ij] for ij in map(tuple, g.apply_topn(scores, int(f * n), absolute).nonzero().tolist())}
                    for f in MIB]
        faith = np.array([(ablated_metric(model, items, c) - empty) / (clean - empty) for c in circuits])
        np.testing.assert_allclose(grid.attrs[f"faithfulness_{name}_curve"], faith, atol=2e-5)
