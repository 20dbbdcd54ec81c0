"""MIB's circuit-track metrics over an edge grid: circuits at fractions of the edges, pruned, and the
CPR and CMD areas of their faithfulness curves (Mueller et al. 2025, hannamw/MIB-circuit-track's
`evaluate_area_under_curve` over hannamw/EAP-IG's `Graph.apply_topn` and `prune`).

    keep = mib_circuit(graph, scores, n=50, absolute=False)     # [writers, readers] bool, pruned
    curves = mib_curves(graph, scores, MIB_FRACTIONS, evaluate, m_clean)   # m(empty): the circuit with no edge, evaluated
    curves["cpr"]["area"], curves["cmd"]["area"]

The definitions, as MIB evaluates a circuit of fraction f of the N edges of the graph:
- its size is int(f * N); its edges the top int(f * N) by signed score (CPR) or by |score| (CMD);
- then, until nothing changes, every node with no incoming or no outgoing kept edge leaves the
  circuit with all its edges (the input node always counts as having incoming edges; the logits
  reader is always present); a node's incoming edges are those into its readers (a head's q, k
  and v; an MLP's input);
- faithfulness f = (m(circuit) - m(empty)) / (m(clean) - m(empty)), each m the metric averaged over
  the items, every edge outside the circuit ablated to its counterfactual value (NaN, and the curves'
  `undefined` says why, where m(clean) = m(empty));
- CPR = sum of trapezoids of f over the fractions themselves (not their logs; a curve at 1 everywhere
  gives 0.999 over MIB's fractions), CMD = the same area of |1 - f| on the absolute ranking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def mib_sign(direction: str | None) -> float:
    """The factor that turns an edges run's stored scores into MIB's sign (positive where the edge carries the
    clean behaviour, as EAP-IG's scores under MIB's `loss=True` metric are): -1 for `direction: noise`, whose
    scores are (a_corrupt - a_clean) . gradient; 1 for denoise's (a_clean - a_corrupt) . gradient."""
    return -1.0 if direction == "noise" else 1.0


def node_inputs(writers: Sequence[str], readers: Sequence[str]) -> np.ndarray:
    """[writers, readers] bool: reader r is one of writer w's own inputs (L0.H1 <- L0.H1.q|k|v,
    L0.MLP <- L0.MLP). A writer with none is the input node (embed); a reader with none is logits."""
    own = {w: i for i, w in enumerate(writers)}
    links = np.zeros((len(writers), len(readers)), dtype=bool)
    for j, r in enumerate(readers):
        base, _, kind = r.rpartition(".")
        w = base if kind in ("q", "k", "v") and base in own else r
        if w in own:
            links[own[w], j] = True
    return links


def prune(keep: np.ndarray, links: np.ndarray) -> np.ndarray:
    """EAP-IG's prune: drop nodes lacking incoming or outgoing kept edges, and their edges, until stable."""
    keep = keep.copy()
    source = ~links.any(1)  # the input node: always treated as having incoming edges
    sink = ~links.any(0)  # the logits reader: always present
    while True:
        outgoing = keep.any(1)
        incoming = (links & keep.any(0)[None]).any(1) | source
        nodes = outgoing & incoming
        readers_alive = (links & nodes[:, None]).any(0) | sink
        pruned = keep & nodes[:, None] & readers_alive[None]
        if np.array_equal(pruned, keep):
            return keep
        keep = pruned


def mib_circuit(graph: object, scores: np.ndarray, n: int, absolute: bool) -> np.ndarray:
    """[writers, readers] bool: the top-n edges of the graph by signed score (absolute=False) or |score|,
    then pruned. Ranked as EAP-IG's `apply_topn` ranks them: the scores as float32 (its `Graph.scores`; a
    JSON's float64 scores are rounded so on `from_json`), `torch.argsort(descending=True)` over the
    [writers, readers] matrix (EAP-IG's [n_forward, n_backward] layout, -inf where no edge), so tied
    scores (a node-level method's, each edge its writer's) fall in EAP-IG's order, not the graph's."""
    import torch

    mask = np.asarray(graph.mask, dtype=bool)
    values = torch.from_numpy(np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=0.0)).float()
    values = torch.abs(values) if absolute else values
    values[~torch.from_numpy(mask)] = -torch.inf
    keep = np.zeros(mask.size, dtype=bool)
    keep[torch.argsort(values.reshape(-1), descending=True)[:n].numpy()] = True
    keep = keep.reshape(mask.shape) & mask
    return prune(keep, node_inputs(graph.writers, graph.readers))


def area(fractions: Sequence[float], values: Sequence[float]) -> float:
    """The trapezoid sum over the fractions themselves (MIB's `log_scale=False`)."""
    x, y = np.asarray(fractions, dtype=np.float64), np.asarray(values, dtype=np.float64)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def mib_curves(graph: object, scores: np.ndarray, fractions: Sequence[float],
               evaluate: Callable[[np.ndarray], np.ndarray], m_clean: float) -> dict:
    """{"fractions", "n_edges", "sizes", "cpr": {...}, "cmd": {...}}: each ranking's circuits (signed for CPR,
    absolute for CMD), their kept edge counts after pruning, metric values, faithfulness and area.
    `evaluate(keep [C, writers, readers])` returns the C circuits' metrics (averaged over the items). m(empty) is
    evaluated as MIB evaluates it (`apply_topn(0)`, then `evaluate_graph`): the circuit with no edge, in the same
    forward as the others, not taken as the corrupted run's metric, which it equals only up to the rounding of the
    rebuilt inputs (in bfloat16 about 1% of m_clean - m_corrupt); so a circuit pruned to nothing scores 0, as in MIB."""
    mask = np.asarray(graph.mask, dtype=bool)
    n_edges = int(mask.sum())
    sizes = [int(f * n_edges) for f in fractions]
    keeps = {name: np.stack([mib_circuit(graph, scores, n, absolute) for n in sizes])
             for name, absolute in (("cpr", False), ("cmd", True))}
    empty = np.zeros((1, *mask.shape), dtype=bool)
    values = np.asarray(evaluate(np.concatenate([empty, keeps["cpr"], keeps["cmd"]])), dtype=np.float64)
    m_empty, values = float(values[0]), values[1:]
    out: dict = {"fractions": [float(f) for f in fractions], "n_edges": n_edges, "sizes": sizes,
                 "metric_clean": float(m_clean), "metric_empty": m_empty}
    if m_clean == m_empty:  # (an ablation other than corrupt: m_empty is known only now, after the scores)
        out["undefined"] = (f"m(clean) equals m(empty circuit) ({m_clean:.6g}), so faithfulness (m - m_empty) / "
                            f"(m_clean - m_empty) is undefined (NaN); choose items the metric separates from the empty circuit")
    for i, name in enumerate(("cpr", "cmd")):
        metric = values[i * len(sizes): (i + 1) * len(sizes)]
        faith = np.full_like(metric, np.nan) if "undefined" in out else (metric - m_empty) / (m_clean - m_empty) + 0.0  # (not -0)
        curve = faith if name == "cpr" else np.abs(1.0 - faith)
        out[name] = {"kept": [int(k.sum()) for k in keeps[name]], "metric": metric.tolist(),
                     "faithfulness": faith.tolist(), "area": area(fractions, curve)}
    return out


def summary(mib: dict) -> str:
    """`CPR 0.512 CMD 0.301`, with the recovered fractions of the CPR curve: one log or inspect line."""
    if mib.get("undefined"):
        return f"CPR nan, CMD nan: {mib['undefined']}"
    fr = ", ".join(f"{f:g}: {v:.3g}" for f, v in zip(mib["fractions"], mib["cpr"]["faithfulness"], strict=True))
    return f"CPR {mib['cpr']['area']:.4g}, CMD {mib['cmd']['area']:.4g} (faithfulness at fractions {fr})"
