"""Faithfulness of the top-k edges: every other edge ablated, exactly, several k in one forward.

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

from typing import Any

import numpy as np
import torch

from hookrun.errors import ConfigError, RunError
from hookrun.runner.kinds.patching.edges.eap import record


def top_edges(graph: Any, scores: np.ndarray, k: int) -> np.ndarray:
    """[writers, readers] bool: the k edges of largest |score| (ties: the graph's order)."""
    flat = np.where(graph.mask.reshape(-1), np.abs(np.nan_to_num(scores.reshape(-1), nan=0.0)), -1.0)
    keep = np.zeros(flat.size, dtype=bool)
    keep[np.argsort(-flat, kind="stable")[:k]] = True
    return keep.reshape(graph.mask.shape) & graph.mask


def faithfulness(engine: Any, graph: Any, wiring: Any, scores: np.ndarray, ks: list[int], ablation: str,
                 corrupt: dict, chunk: int | None = None) -> dict:
    """{"k", "recovered", "metric", "metric_clean", "metric_corrupt"}: one value per k."""
    b = engine.block
    clean_ids = engine.items[b.clean]
    m_clean, m_corrupt = engine.metric_clean, engine.metric_corrupt
    if m_clean == m_corrupt:
        raise ConfigError(f"patching.faithfulness: the clean and corrupted runs give the same metric ({m_clean:.6g}), "
                          f"so the recovered fraction (m - m_corrupt) / (m_clean - m_corrupt) is undefined; choose items "
                          f"the metric separates")
    repl = corrupt if ablation == "corrupt" else {g: a.mean(0, keepdim=True) for g, a in corrupt.items()}
    chunk = chunk or len(ks)
    values = []
    for start in range(0, len(ks), chunk):
        part = ks[start: start + chunk]
        keep = np.stack([top_edges(graph, scores, k) for k in part])  # [C, W, R]
        values += list(_ablated(engine, graph, wiring, clean_ids, keep, repl))
    values = np.asarray(values, dtype=np.float64)
    return {"k": list(map(int, ks)), "recovered": ((values - m_corrupt) / (m_clean - m_corrupt)).tolist(),
            "metric": values.tolist(), "metric_clean": m_clean, "metric_corrupt": m_corrupt, "ablation": ablation}


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
            a = live[wg]
            diff = (a.view(C, n, *a.shape[1:]) - repl[wg].unsqueeze(0).to(a.dtype))  # [C, n, P, kw, d]
            ex = excluded[:, ws, rs].to(a.dtype)  # [C, kw, kr]
            out = out - torch.einsum("cnpwd,cwr->cnprd", diff, ex).reshape(x.shape)
        return out

    with torch.no_grad(), wiring.tap(writer=record(live), reader=reader):
        logits = engine.forward(ids.repeat(C, 1))
        return engine.measure(logits, C).cpu().numpy()
