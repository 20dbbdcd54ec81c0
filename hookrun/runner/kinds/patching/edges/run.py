"""An edges run, set up and computed: the checks before any forward, the scores, the faithfulness curve.

    graph, wiring = prepare(model, block, items)          # one ConfigError before any forward
    result = compute(engine, graph, wiring)               # EdgeResult: scores [writers, readers], curve
    result.meta()                                          # what the file's `patching` attribute adds

`engine` is the patching engine with no sites (runner/kinds/patching/engine.py): its forward, its metric
and the clean and corrupted runs' metric values.

Faithfulness of the top-k edges: every other edge ablated, exactly, several k in one forward.

    curve = faithfulness(engine, graph, wiring, scores, ks=[10, 50], ablation="corrupt", corrupt=writers)

A circuit is the top-k edges by |score| (the [writer, reader] grid, summed over positions), each kept
at every position. One forward of the clean input, repeated once per k along the batch (as exact
grids pack cells): each reader's input is rebuilt as

    input[r] - sum over writers w feeding r, outside copy c's circuit, of (live[w] - replacement[w])

where live[w] is the writer's contribution in this very run and the replacement its contribution on
the corrupted input (ablation=corrupt) or its mean over the items' corrupted inputs (ablation=mean),
per position: TransformerLens 4.3's `faithfulness`, which rebuilds a reader's input the same way.
recovered = (m_ablated - m_corrupt) / (m_clean - m_corrupt) per k, the metric averaged over the items.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookrun.errors import ConfigError, HookrunError, RunError
from hookrun.runner.kinds.patching.edges.bounded import EdgeBytes
from hookrun.runner.kinds.patching.edges.eap import bounded, edge_scores, record
from hookrun.runner.kinds.patching.edges.formats import read_circuit
from hookrun.runner.kinds.patching.edges.graph import Graph, find_graph, unscored
from hookrun.runner.kinds.patching.edges.mib import mib_curves, mib_sign
from hookrun.runner.kinds.patching.edges.spec import (
    DEFAULT_STEPS,
    EDGE_METHODS,
    FROM_FORMS,
    check_circuits,
)


@dataclass
class EdgeResult:
    graph: Graph
    scores: np.ndarray  # [writers, readers], NaN where the writer does not feed the reader
    ig_steps: int
    faithfulness: dict | None = None
    node_positions: np.ndarray | None = None  # [writers, positions]: each writer's score at each position
    d_model: int | None = None  # the residual stream's width (EAP-IG's cfg: edges/formats.py)

    @property
    def node_scores(self) -> np.ndarray:
        """Each writer's outgoing sum (with the logits reader in it, a writer's own score)."""
        return np.nansum(self.scores, axis=1)

    def layout(self) -> dict:
        return edge_layout(self.graph)

    def meta(self) -> dict:
        return {"graph": self.graph.describe(), "ig_steps": self.ig_steps, "node_scores": self.node_scores.tolist(),
                "node_scores_by_position": None if self.node_positions is None else self.node_positions.tolist(),
                "faithfulness": self.faithfulness, "d_model": self.d_model}


def edge_layout(g: Graph) -> dict:
    """The file's layout of the one grid `edges`: cell w * readers + r is writer w's edge into reader r."""
    return {"edges": {"modules": list(g.writers), "over": ["reader"], "sizes": [len(g.readers)], "offset": 0,
                      "dims": ["writer", "reader"]}}


def streams(engine: Any, graph: Graph, wiring: Any) -> bool:
    """A file run's grid is written as it goes when the run takes the bounded route (edges/bounded.py); the
    checks that route and faithfulness make come here, before the file is opened."""
    b = engine.block
    if not bounded(engine, graph, wiring, b.ig_steps if b.method == "eap_ig" else 1):
        return False
    if b.faithfulness is not None and engine.metric_clean == engine.metric_corrupt:
        faithfulness(engine, graph, wiring, np.zeros(graph.mask.shape), [], "corrupt", {})  # its one ConfigError line
    return True


def prepare(model: Any, block: Any, items: dict) -> tuple[Graph, Any]:
    graph, wiring = find_graph(model, "patching.graph=auto")
    check_circuits(block.faithfulness, graph.edges)
    EdgeBytes.of(model, wiring, graph, items[block.clean]).check(block.memory)  # one reader group fits (edges/bounded.py)
    if block.faithfulness is not None and torch.equal(items[block.clean], items[block.corrupt]):
        raise ConfigError(f"patching.clean / patching.corrupt: every item's clean input {block.clean!r} equals its corrupted "
                          f"one {block.corrupt!r}, so faithfulness' recovered fraction (m - m_corrupt) / (m_clean - m_corrupt) "
                          f"is undefined; give corrupted inputs that differ")
    if block.faithfulness is not None and block.faithfulness.source not in EDGE_METHODS:
        file_scores(block.faithfulness.source, graph)  # a missing or foreign file: refused before any forward
    return graph, wiring


def check_atp_ig(model: Any, block: Any) -> None:
    """atp_ig interpolates the token embedding: a model without a residual graph is refused before any forward."""
    if block.method == "atp_ig":
        from hookrun.runner.kinds.patching.edges.wiring import find_wiring

        find_wiring(model, "patching.method=atp_ig")


def compute(engine: Any, graph: Graph, wiring: Any, sink: Any = None) -> EdgeResult:
    """`sink(rs, columns)`: each reader group's final (normalized) columns as they are finished (edges/bounded.py)."""
    b = engine.block
    steps = b.ig_steps if b.method == "eap_ig" else 1
    gap = engine.metric_clean - engine.metric_corrupt
    scale = (1 / gap if gap != 0 else np.nan) if b.normalize else 1.0
    put = None if sink is None else (lambda rs, columns: sink(rs, columns * scale))
    scores, base, source = edge_scores(engine, graph, wiring, steps, put)
    finite_scores(scores, graph, b.metric)
    by_position = engine.node_positions
    curve = None
    f = b.faithfulness
    if f is not None:
        if f.source in EDGE_METHODS:  # ranked as the file stores them (normalized: over the gap, whose sign may flip
            # them), in MIB's sign (a noise run's negated), as `circuits export` writes them
            rank = scores if f.source == b.method else edge_scores(engine, graph, wiring, 1 if f.source == "eap" else DEFAULT_STEPS)[0]
            finite_scores(rank, graph, b.metric)
            rank = rank * scale * mib_sign(b.direction)
        else:
            rank = file_scores(f.source, graph)
        corrupt = base if b.direction == "denoise" else source
        chunk = b.cells_per_forward or max(1, b.memory // max(1, engine.copy_bytes))
        curve = faithfulness(engine, graph, wiring, rank, list(f.edges), f.ablation, corrupt, chunk)
        curve["from"] = f.source
        if f.fractions:  # MIB's circuits at fractions of the edges, and its CPR / CMD areas (edges/mib.py)
            evaluate = lambda keep: ablated_metrics(engine, graph, wiring, keep, f.ablation, corrupt, chunk)  # noqa: E731
            curve["mib"] = mib_curves(graph, rank, f.fractions, evaluate, engine.metric_clean)  # (m(empty) evaluated there)
    if b.normalize:
        scores, by_position = scores * scale, by_position * scale
    return EdgeResult(graph, scores, steps, curve, by_position, int(base[("embed",)].shape[-1]))


def finite_scores(scores: np.ndarray, graph: Graph, metric: str) -> None:
    """A metric whose gradient is not finite (a sqrt or log at 0) gave NaN scores, shown as cells with no edge and
    ranked as 0 by faithfulness, in a run said complete: one RunError naming the first such edge."""
    lost = unscored(graph.mask, scores, graph.writers, graph.readers, of=f"the graph's {graph.edges} edges")
    if lost:
        raise RunError(f"patching.metric {metric}: its gradient is not finite, so {lost}; "
                       f"use a metric whose gradient is finite at these inputs (no sqrt or log at 0)")


def file_scores(path: str, graph: Graph) -> np.ndarray:
    """The edge grid of an earlier edges run (faithfulness.from: PATH; in MIB's sign, edges/mib.py), or of an
    EAP-IG graph JSON or a MIB folder (edges/formats.py), checked against this model's graph."""
    if path.endswith(".json") or Path(path).is_dir():
        return read_circuit(path, graph.writers, graph.readers, graph.mask)
    from hookrun.runner.kinds.patching.reader import edge_values
    from hookrun.store.reading import open_source

    try:
        source = open_source(path)
    except (HookrunError, OSError) as exc:
        raise ConfigError(f"patching.faithfulness.from={path!r}: {exc}; give {FROM_FORMS}") from None
    try:
        scores, meta = edge_values(source.file)
    except (LookupError, OSError) as exc:
        raise ConfigError(f"patching.faithfulness.from={path!r}: {exc}") from None
    finally:
        source.close()
    g = meta["graph"]
    scores = scores * mib_sign(meta.get("direction"))  # (a noise run's scores, in MIB's sign)
    if tuple(g["writers"]) != graph.writers or tuple(g["readers"]) != graph.readers:
        raise ConfigError(f"patching.faithfulness.from={path!r}: its graph ({len(g['writers'])} writers, "
                          f"{len(g['readers'])} readers) is not this model's ({len(graph.writers)}, {len(graph.readers)})")
    other = np.isfinite(scores) != graph.mask  # same labels, other edges: a parallel block (GPT-NeoX) against a sequential one
    if other.any():
        i, j = np.argwhere(other)[0]
        edge = f"{graph.writers[i]} -> {graph.readers[j]}"
        order = lambda p: "in parallel" if p else "in sequence"  # noqa: E731
        lost = unscored(graph.mask, scores, graph.writers, graph.readers)
        if bool(g.get("parallel")) == graph.parallel and lost:  # the same graph: scores that are not finite numbers
            raise ConfigError(f"patching.faithfulness.from={path!r}: {lost}; faithfulness ranks edges by finite scores")
        missing = bool(graph.mask[i, j])
        n = int((other & graph.mask).sum() if missing else (other & ~graph.mask).sum())
        what = f"lacks {n} of this model's edges" if missing else f"scores {n} edges this model lacks"
        raise ConfigError(f"patching.faithfulness.from={path!r}: its graph has this model's nodes but it {what}, the first "
                          f"{edge}; its model runs attention and MLP {order(g.get('parallel'))}, this one "
                          f"{order(graph.parallel)}: the circuit is for another model")
    return scores


def top_edges(graph: Any, scores: np.ndarray, k: int) -> np.ndarray:
    """[writers, readers] bool: the k edges of largest |score| (ties: the graph's order)."""
    flat = np.where(graph.mask.reshape(-1), np.abs(np.nan_to_num(scores.reshape(-1), nan=0.0)), -1.0)
    keep = np.zeros(flat.size, dtype=bool)
    keep[np.argsort(-flat, kind="stable")[:k]] = True
    return keep.reshape(graph.mask.shape) & graph.mask


def faithfulness(engine: Any, graph: Any, wiring: Any, scores: np.ndarray, ks: list[int], ablation: str,
                 corrupt: dict, chunk: int | None = None) -> dict:
    """{"k", "recovered", "metric", "metric_clean", "metric_corrupt"}: one value per k."""
    m_clean, m_corrupt = engine.metric_clean, engine.metric_corrupt
    if m_clean == m_corrupt:
        raise ConfigError(f"patching.faithfulness: the clean and corrupted runs give the same metric ({m_clean:.6g}), "
                          f"so the recovered fraction (m - m_corrupt) / (m_clean - m_corrupt) is undefined; choose items "
                          f"the metric separates")
    keep = np.stack([top_edges(graph, scores, k) for k in ks]) if ks else np.zeros((0, *graph.mask.shape), dtype=bool)
    values = ablated_metrics(engine, graph, wiring, keep, ablation, corrupt, chunk)
    return {"k": list(map(int, ks)), "recovered": ((values - m_corrupt) / (m_clean - m_corrupt)).tolist(),
            "metric": values.tolist(), "metric_clean": m_clean, "metric_corrupt": m_corrupt, "ablation": ablation}


def ablated_metrics(engine: Any, graph: Any, wiring: Any, keep: np.ndarray, ablation: str, corrupt: dict,
                    chunk: int | None = None) -> np.ndarray:
    """The metric (averaged over the items) of each circuit keep[c] ([C, writers, readers] bool), every other
    edge ablated; `chunk` circuits per forward."""
    repl = corrupt if ablation == "corrupt" else {g: a.mean(0, keepdim=True) for g, a in corrupt.items()}
    ids = engine.items[engine.block.clean]
    chunk = chunk or max(1, len(keep))
    values = [v for start in range(0, len(keep), chunk)
              for v in _ablated(engine, graph, wiring, ids, keep[start: start + chunk], repl)]
    return np.asarray(values, dtype=np.float64)


def _ablated(engine: Any, graph: Any, wiring: Any, ids: torch.Tensor, keep: np.ndarray, repl: dict) -> np.ndarray:
    C, n = keep.shape[0], ids.shape[0]
    device = ids.device
    excluded = torch.as_tensor(graph.mask[None] & ~keep, device=device)
    live: dict = {}

    def reader(group, x):
        rs = graph.reader_groups[group]
        out = x
        for wg, ws in graph.writer_groups.items():
            if not graph.feeds(wg, group):
                continue
            if wg not in live:
                raise RunError(f"patching.faithfulness: writer {wg} had not run when reader {group} read its input")
            a = live[wg].view(C, n, *live[wg].shape[1:])
            diff = a - repl[wg].unsqueeze(0).to(a.dtype)  # [C, n, P, kw, d]
            ex = excluded[:, ws, rs].to(a.dtype)  # [C, kw, kr]
            swap = torch.einsum("cnpwd,cwr->cnprd", diff, ex)
            post = wiring.post_norms.get(wg)
            if post is not None:  # the group's norm re-run on each reader's mix of live and replaced writers
                swap = _renormed(post, a, swap)
            out = out - swap.reshape(x.shape)
        return out

    with torch.no_grad(), wiring.tap(writer=record(live), reader=reader):
        logits = engine.forward(ids.repeat(C, 1))
        return engine.measure(logits, C).cpu().numpy()


def _renormed(post: tuple, live: torch.Tensor, swap: torch.Tensor) -> torch.Tensor:
    """What a reader's input loses when a post-normed group (Gemma 2's heads, then post_attention_layernorm) has the
    writers in `swap` ([C, n, P, kr, d]: per reader, the sum of its ablated writers' live - replacement) replaced:
    norm(live sum) - norm(live sum - swap), the norm re-run on the mix per reader, as EAP-IG's evaluate_graph does
    for TransformerLens' ln1_post (MIB's evaluation); `live` [C, n, P, kw, d] the writers in this run."""
    norm, bias = post
    total = live.sum(3) if bias is None else live.sum(3) + bias.to(live.dtype)  # the norm's input in this run
    return norm.forward(total).unsqueeze(3) - norm.forward(total.unsqueeze(3) - swap)
