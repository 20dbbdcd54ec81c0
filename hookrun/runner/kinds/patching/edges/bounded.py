"""Edges within `patching.memory`: each reader group's gradient folded into the grid as the backward makes it.

    sizes = EdgeBytes.of(model, wiring, graph, items[block.clean])   # from shapes, before any forward
    sizes.check(block.memory)                                         # one ConfigError when it cannot fit
    scores, by_position = streamed_scores(engine, graph, wiring, m, source, base, per)

What an edges run holds beyond the model (eap.py): the writers' contributions on both inputs
(2 x writers x items x positions x d_model), the forward of the interpolated copies kept for the
backward, and, on the fast route, the gradient of every reader at once (readers x items x positions x
d_model, twice while a chunk's gradients add up). The [writer, reader] grid itself is writers x readers
float64, small beside them. When they do not fit in `memory`, no reader's gradient is kept: each reader
group's input passes through an identity whose backward receives the group's gradient the moment the
backward has summed it, adds its scores (d metric / d input[r] against every writer feeding r) to the grid
and lets it go on (one matrix product: the writers feeding a reader are always the graph's first
ones); one backward per chunk of copies, so the values are the same sums in another order. The
smallest budget that works holds the writers, their differences (float64) and one reader group's
gradient; a smaller one is one ConfigError line before any forward. A file run hands `sink` each reader
group's final columns as the last chunk's backward folds them, and writes them as one step (kind.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hookrun.errors import ConfigError, RunError


@dataclass(frozen=True)
class EdgeBytes:
    writers: int  # the writers' contributions on the base and source inputs, held the whole run
    grads: int  # every reader's gradient for one copy of the items (the fast route holds them)
    group: int  # the bounded route's one reader group in flight: its gradient twice (as it comes, laid out by reader)
    # and its sum over readers, float64
    deltas: int  # the bounded route's writers' differences (source - base), float64
    taps: int  # what the reader taps add to one copy's forward (per-head copies of the q/k/v inputs)

    @classmethod
    def of(cls, model: Any, wiring: Any, graph: Any, ids: torch.Tensor) -> EdgeBytes:
        p = next(model.parameters(), None)
        elem = torch.empty((), dtype=p.dtype if p is not None else torch.float32).element_size()
        slot = int(ids.shape[0]) * int(ids.shape[1]) * d_model(model, wiring)  # one node's [items, positions, d_model]
        widest = max(s.stop - s.start for s in (*graph.reader_groups.values(), *graph.writer_groups.values()))
        readers = len(graph.readers)
        return cls(writers=2 * len(graph.writers) * slot * elem, grads=readers * slot * elem,
                   group=(2 * widest + 1) * slot * 8, deltas=len(graph.writers) * slot * 8, taps=3 * readers * slot * elem)

    @property
    def floor(self) -> int:
        return self.writers + self.deltas + self.group

    def check(self, memory: int) -> None:
        if memory < self.floor:
            raise ConfigError(f"patching.memory={memory} bytes is too small for one reader group of this edges run: the "
                              f"writers' contributions on both inputs and their differences take {self.writers + self.deltas} "
                              f"and one reader group's gradient {self.group}; give at least {self.floor} bytes ({_mib(self.floor)}) for these, "
                              f"and more for one copy's forward and backward (measured on the first forward, which then "
                              f"names the whole)")

    def fast(self, memory: int, forward: int, m: int) -> int:
        """Copies per chunk on the fast route (every reader's gradient held, twice while a chunk's add up), `forward`
        bytes a copy's forward and backward; 0 when not even one copy fits beside them."""
        per_copy = 2 * self.grads + forward + self.taps  # the zeros added at the readers, and their gradients
        return max(0, min(m, (memory - self.writers - self.grads) // per_copy))

    def copies(self, memory: int, forward: int, m: int) -> int:
        """Copies per chunk on the bounded route; a ConfigError when not even one fits."""
        per_copy = forward + self.taps + self.group
        if memory < self.floor + per_copy - self.group:
            need = self.floor + per_copy - self.group
            raise ConfigError(f"patching.memory={memory} bytes cannot hold one copy of the items' forward and backward "
                              f"(about {forward + self.taps} bytes measured on the base run) with the writers' contributions "
                              f"({self.writers + self.deltas}) and one reader group ({self.group}); give at least {need} bytes ({_mib(need)})")
        return max(1, min(m, (memory - self.writers - self.deltas) // per_copy))


def _mib(n: int) -> str:
    """n bytes in MiB, rounded up to a tenth: the value named is itself enough (patching.memory=0.7MiB)."""
    return f"{math.ceil(n * 10 / (1 << 20)) / 10:.1f}MiB"


def d_model(model: Any, wiring: Any) -> int:
    cfg = getattr(model, "cfg", None)
    if cfg is not None and getattr(cfg, "d_model", None):
        return int(cfg.d_model)
    return int(wiring.embed_module.weight.shape[1])


class _Fold(torch.autograd.Function):
    """The identity; its backward hands the gradient to `fold` before passing it on."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fold: Any) -> torch.Tensor:
        ctx.fold = fold
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        ctx.fold(g)
        return g, None


def streamed_scores(engine: Any, graph: Any, wiring: Any, m: int, source: dict, base: dict,
                    per: int, sink: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """eap.edge_scores' grid and by-position sums, no reader's gradient kept; `base` is filled with the base run's
    writer contributions (copy 0 of the first chunk). `sink(rs, columns)`: called with each reader group's final
    columns [writers, len(rs)] (NaN where no edge) the moment its last chunk's gradient is folded in, in the
    backward's order (a file run writes them as it goes: runner/kinds/patching/kind.py)."""
    n = engine.n
    source_embed = source[("embed",)][:, :, 0]
    scores = np.zeros(graph.mask.shape)
    by_position = np.zeros((len(graph.writers), engine.base_ids.shape[1]))
    seen: set = set()
    deltas: dict = {}  # "d": every writer's source - base contribution, one row each, float64
    prefix = {group: _prefix(graph, rs) for group, rs in graph.reader_groups.items()}
    for start in range(0, m, per):
        c = min(per, m - start)
        alpha = (torch.arange(start, start + c, dtype=source_embed.dtype, device=source_embed.device) / m)
        alpha = alpha.repeat_interleave(n).view(-1, 1, 1)
        leaf: dict = {}
        written: dict = {}

        def embed(x, alpha=alpha, c=c, leaf=leaf):
            leaf["z"] = torch.zeros((), dtype=x.dtype, device=x.device, requires_grad=True)  # what the backward reaches
            return x + alpha.to(x.dtype) * (source_embed.repeat(c, 1, 1).to(x.dtype) - x) + leaf["z"]

        def fold(group, g, c=c, last=start + c == m):
            g = g.reshape(c, n, *g.shape[1:]).sum(0).double()  # [n, P, r, d]
            rs, k = graph.reader_groups[group], prefix[group]
            scores[:k, rs] += (deltas["d"][:k] @ g.permute(2, 0, 1, 3).reshape(g.shape[2], -1).T).cpu().numpy()
            by_position[:k] += torch.einsum("wnpd,npd->wp", deltas["d"][:k].view(k, *g.shape[:2], -1), g.sum(2)).cpu().numpy()
            seen.add(group)
            if last and sink is not None:
                sink(rs, np.where(graph.mask[:, rs], scores[:, rs], np.nan))

        keep = (lambda group, a, written=written: written.__setitem__(group, a[:n].detach().clone())) if start == 0 else None
        with torch.enable_grad(), wiring.tap(embed=embed, writer=keep,
                                             reader=lambda group, x: _Fold.apply(x, lambda g, group=group: fold(group, g))):
            metric = engine.measure(engine.forward(engine.base_ids.repeat(c, 1)), c).sum() / m
        if start == 0:
            base.update(written)
            d = deltas["d"] = source_embed.new_empty((len(graph.writers), source_embed.numel()), dtype=torch.float64)
            for wg, ws in graph.writer_groups.items():  # [writers, items x positions x d_model]
                d[ws] = (source[wg] - base[wg]).double().permute(2, 0, 1, 3).reshape(ws.stop - ws.start, -1)
        torch.autograd.grad(metric, [leaf["z"]])
    missing = [g for g in graph.reader_groups if g not in seen]
    if missing:
        raise RunError(f"patching: {missing[0]} is not on the metric's gradient path")
    return np.where(graph.mask, scores, np.nan), by_position


def _prefix(graph: Any, rs: slice) -> int:
    """How many writers feed the reader group: in the graph's order they are always the first ones."""
    column = graph.mask[:, rs.start]
    k = int(column.sum())
    if not column[:k].all():
        raise RunError(f"patching: the writers feeding reader {graph.readers[rs.start]} are not the graph's first {k}")
    return k
