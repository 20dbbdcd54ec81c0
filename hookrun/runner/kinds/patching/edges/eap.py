"""EAP and EAP-IG edge scores, and the interpolated gradient pass atp_ig shares with them.

    scores, base, source = edge_scores(engine, graph, wiring, m=5)   # [writers, readers], float64

One gradient pass over every item at once: the base input (the corrupted one for direction=denoise)
repeated m times along the batch, the residual stream's first value (the embedding) of copy k set to
e_base + (k / m)(e_source - e_base), k = 0..m-1 (Hanna et al.'s loop: m = 1 is plain EAP, copy 0 is
the base run itself), zeros that require grad added at every reader's input, and one backward of the
metric averaged over the copies. Then

    score(w -> r) = sum over items, positions, d_model of (a_source[w] - a_base[w]) * d metric / d input[r]

with the metric averaged over the items (so the score is averaged over them too): TransformerLens
4.3's `attribution_patch(granularity="edge")` in its denoising sign. The copies go through in chunks
(`memory`, the block's budget for a forward's activations, measured on the base run) whose gradients
add up. When every reader's gradient does not fit in `memory` beside them, edges/bounded.py folds each
reader group's gradient into the grid as the backward makes it, and keeps none.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hookrun.errors import RunError
from hookrun.runner.kinds.patching.cell_action import CellMode
from hookrun.runner.kinds.patching.edges.bounded import EdgeBytes, streamed_scores


def record(into: dict):
    return lambda group, a: into.__setitem__(group, a.detach())


def writer_outputs(engine: Any, wiring: Any, ids: torch.Tensor) -> dict:
    """Each writer group's contribution on `ids`, [items, position, k, d_model]."""
    out: dict = {}
    with torch.no_grad(), wiring.tap(writer=record(out)):
        engine.forward(ids)
    return out


def interpolated_grads(engine: Any, wiring: Any, m: int, source_embed: torch.Tensor, reader: Any = None,
                       keep_writers: dict | None = None, leaves: Any = None, per: int | None = None) -> dict:
    """Run the m interpolated copies (in chunks) and return d mean-metric / d leaf, summed over the copies,
    for the leaves `leaves(deltas_of_this_chunk)` names; reader taps add zeros requiring grad when
    `reader` is True. `keep_writers`: filled with copy 0's writer contributions (the base run's). `per`: copies a
    chunk (edges' fast route sizes it beside the gradients it holds); by default from `memory` and one copy's bytes."""
    n = engine.n
    per = per or max(1, min(m, engine.block.memory // max(1, 3 * engine.copy_bytes)))  # a backward keeps ~3 forwards' bytes
    total: dict = {}
    for start in range(0, m, per):
        c = min(per, m - start)
        alpha = (torch.arange(start, start + c, dtype=source_embed.dtype, device=source_embed.device) / m)
        alpha = alpha.repeat_interleave(n).view(-1, 1, 1)
        deltas: dict = {}
        written: dict = {}

        def embed(x, alpha=alpha, c=c):
            return x + alpha.to(x.dtype) * (source_embed.repeat(c, 1, 1).to(x.dtype) - x)

        def add_zeros(group, x, deltas=deltas):
            d = torch.zeros_like(x, requires_grad=True)
            deltas[group] = d
            return x + d

        with torch.enable_grad(), wiring.tap(embed=embed, writer=record(written) if start == 0 and keep_writers is not None else None,
                                             reader=add_zeros if reader else None):
            if leaves is not None:  # atp_ig: the sites' PatchCells add the zeros (engine.state.deltas)
                engine.state.mode, engine.state.deltas = CellMode.GRAD, {}
            try:
                metric = engine.measure(engine.forward(engine.base_ids.repeat(c, 1)), c).sum() / m
            finally:
                engine.state.mode = CellMode.OFF
        named = dict(deltas) if reader else dict(leaves())
        keys = list(named)
        grads = torch.autograd.grad(metric, [named[k] for k in keys], allow_unused=True)
        for k, g in zip(keys, grads, strict=True):
            if g is None:
                raise RunError(f"patching: {k} is not on the metric's gradient path")
            g = g.view(c, n, *g.shape[1:]).sum(0)
            total[k] = g if k not in total else total[k] + g
        if start == 0 and keep_writers is not None:
            keep_writers.update({k: v[:n] for k, v in written.items()})
    return total


def base_embedding(engine: Any, wiring: Any, ids: torch.Tensor) -> torch.Tensor:
    out: dict = {}
    with torch.no_grad(), wiring.tap(writer=record(out)):
        engine.forward(ids)
    return out[("embed",)][:, :, 0]


def edge_scores(engine: Any, graph: Any, wiring: Any, m: int, sink: Any = None) -> tuple[np.ndarray, dict, dict]:
    """[writers, readers] scores (NaN where no edge), the base and source runs' writer contributions; `sink`:
    edges/bounded.py's, each reader group's columns as they are finished (the fast route: every group at the end)."""
    source = writer_outputs(engine, wiring, engine.source_ids)
    base: dict = {}
    sizes, memory = EdgeBytes.of(engine.model, wiring, graph, engine.base_ids), engine.block.memory
    forward = 3 * engine.copy_bytes  # a backward keeps ~3 forwards' bytes
    per = sizes.fast(memory, forward, m)
    if per == 0:  # every reader's gradient does not fit: edges/bounded.py
        scores, engine.node_positions = streamed_scores(engine, graph, wiring, m, source, base,
                                                        sizes.copies(memory, forward, m), sink=sink)
        return scores, base, source
    grads = interpolated_grads(engine, wiring, m, source[("embed",)][:, :, 0], reader=True, keep_writers=base, per=per)
    scores = np.full(graph.mask.shape, np.nan)
    by_position = np.zeros((len(graph.writers), engine.base_ids.shape[1]))  # each writer's score at each position
    for rg, rs in graph.reader_groups.items():
        g = grads[rg].double()
        for wg, ws in graph.writer_groups.items():
            if graph.feeds(wg, rg):
                delta = (source[wg] - base[wg]).double()
                scores[ws, rs] = torch.einsum("npwd,nprd->wr", delta, g).cpu().numpy()
                by_position[ws] += torch.einsum("npwd,nprd->wp", delta, g).cpu().numpy()
    engine.node_positions = by_position
    for rs in graph.reader_groups.values() if sink is not None else ():
        sink(rs, scores[:, rs])
    return scores, base, source


def bounded(engine: Any, graph: Any, wiring: Any, m: int) -> bool:
    """Whether the edges run takes edges/bounded.py's route (every reader's gradient does not fit in `memory`);
    a ConfigError when not even one copy fits there (before any gradient pass)."""
    sizes, memory, forward = EdgeBytes.of(engine.model, wiring, graph, engine.base_ids), engine.block.memory, 3 * engine.copy_bytes
    if sizes.fast(memory, forward, m) > 0:
        return False
    sizes.copies(memory, forward, m)
    return True


def atp_ig_grads(engine: Any) -> dict:
    """atp_ig: d metric / d each site's output, averaged over the block's ig_steps interpolated runs (summed
    over the copies of the mean-over-copies metric), by module: engine.atp's gradients with m runs."""
    from hookrun.runner.kinds.patching.edges.wiring import find_wiring

    wiring = find_wiring(engine.model, "patching.method=atp_ig")  # where the embedding is
    source = writer_outputs(engine, wiring, engine.source_ids)
    return interpolated_grads(engine, wiring, engine.block.ig_steps, source[("embed",)][:, :, 0],
                              leaves=lambda: engine.state.deltas)
