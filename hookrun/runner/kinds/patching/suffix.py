"""Exact cells of a causal language model, each packed forward run from its first patched position on.

    route = SuffixRoute.find(engine, base_logits)   # None: the full path for every cell
    route.start(k)                                  # cell k's position, None: k needs the full path
    values = route.exact(ks, plan)                  # None: a cell of ks needs the full path

In a causal model nothing before the earliest patched position p0 of a packed forward differs from
the base run, in any layer. So a chunk whose cells all sit at a position (a site whose output is
[sample, position, ...], patched along `position`, inside the stack of blocks) runs:

- only positions p0.. (the suffix), the keys and values of positions < p0 taken from the base run
  (the model's own cache: families.py);
- only the blocks at and above the lowest patched one: the suffix's residual at that block is the
  base run's (kept once by one extra forward of the base input);
- the final norm and the unembedding only at the position each item's metric reads (the built-in
  metrics but ce read one position: metric.position, or an item key).

p0 is also at most the read position. A user metric or ce (they read every position), a run with
other hooks beside the sites (they would see the suffix only: hookrun's `hooks:`, and any forward
hook or pre-hook on the model or global that hookrun did not attach, `hooks_on`), inputs beside the
ids (data.inputs' attention_mask: the cache is the unmasked one), a model not in families.py, or a
first resumed forward whose logits differ from the full forward's (checked once) turn the route
off; cells at a site without a position axis (or outside the stack) take the full path chunk by
chunk. ROUTES turns each saving off (benchmarks/patching.py measures each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from hookrun.runner.kinds.patching.cell_action import CellMode
from hookrun.runner.kinds.patching.families import find_family

if TYPE_CHECKING:
    from hookrun.runner.kinds.patching.cells import SiteGrid

# `engine` below is the PatchEngine (engine.py) that owns the route; it is not imported here, so that
# engine.py -> suffix.py stays the one direction between them.


@dataclass
class Routes:
    suffix: bool = True  # run positions p0.. only
    skip: bool = True  # start at the lowest patched block
    narrow: bool = True  # unembed only where the metric reads


ROUTES = Routes()
MIN_ROWS = 64  # a chunk is not cut for its positions before it holds this many rows (cells x items)
SPREAD = 4  # ... and then where a cell lies more than 1/SPREAD of the suffix after the chunk's first
LINE_METRICS = ("logit_diff", "logit", "logprob", "prob", "kl")  # read one position per item


class SuffixRoute:
    def __init__(self, engine: Any, family, reads: torch.Tensor) -> None:
        self.engine, self.family, self.reads = engine, family, reads
        self.forwards = 0  # packed forwards that took this route
        self.kv, self.resid = family.base(engine.base_ids)
        self.length = engine.base_ids.shape[1]
        stack = engine.stack
        self.skip_ok = stack is not None and stack.ordered and stack.prefix == family.blocks_name
        self.grids = {g.name: self._fits(g) for g in engine.layout.grids}

    @classmethod
    def find(cls, engine: Any, base_logits: torch.Tensor) -> SuffixRoute | None:
        b, ids = engine.block, engine.base_ids
        if engine.extra_points or engine.call.extra or engine.foreign_hooks or b.user_metric is not None or b.metric not in LINE_METRICS:
            return None
        if ids.dim() != 2 or ids.dtype.is_floating_point or base_logits.dim() != 3 or base_logits.shape[1] != ids.shape[1]:
            return None
        family = find_family(engine.model, b.input)
        if family is None:
            return None
        n, t = ids.shape
        reads = (engine.items[b.position].to(ids.device).long().reshape(n) if isinstance(b.position, str)
                 else torch.full((n,), int(b.position), device=ids.device)) % t
        try:
            with torch.no_grad():
                route = cls(engine, family, reads)
                p0, level = int(reads.min()) // 2, len(family.blocks) // 2
                logits = route._logits(p0, level, 1)
        except (TypeError, ValueError, AttributeError, RuntimeError, IndexError):
            return None  # a version of the family whose cache or forward is not the one known here
        want = base_logits[torch.arange(n, device=ids.device), reads][:, None]
        if logits.shape != want.shape or not torch.allclose(logits, want.to(logits.dtype), rtol=1e-4, atol=1e-4):
            return None
        return route

    def _fits(self, g: SiteGrid) -> bool:
        """A grid whose cells can take the route: [sample, position, ...] patched along position, in the stack."""
        prefix = self.family.blocks_name + "."
        return (len(g.dims) > 1 and g.dims[1] == "position" and "position" in g.over
                and all(m.split("/")[0].startswith(prefix) for m in g.modules)
                and all(self.engine.source[m].shape[1] == self.length for m in g.modules))

    def start(self, k: int) -> int | None:
        g = self.engine.layout.grid_of(k)
        if not self.grids[g.name]:
            return None
        return g.cell(k - g.offset).index[g.over.index("position")]

    def cut(self, start: int, at: int, rows: int) -> bool:
        """Whether a chunk whose first cell is at `start` ends before a cell at `at`: a forward runs
        positions min(start, ...).., so a cell far after (or before) the first one pays for positions
        it does not need; a small chunk is kept whole (a forward has a cost of its own)."""
        return rows >= MIN_ROWS and (at < start or (at - start) * SPREAD > self.length - start)

    def level(self, module: str) -> int:
        name = module.split("/")[0]
        return int(name[len(self.family.blocks_name) + 1:].split(".")[0])

    def exact(self, ks: list[int], plan: dict[str, list]) -> np.ndarray | None:
        starts = [self.start(k) for k in ks]
        if any(s is None for s in starts):
            return None
        e = self.engine
        p0 = min(min(starts), int(self.reads.min())) if ROUTES.suffix else 0
        level = min(self.level(m) for m in plan) if ROUTES.skip and self.skip_ok else 0
        shifted = {m: [(c, (index[0] - p0, *index[1:])) for c, index in cells] for m, cells in plan.items()}
        e.state.begin_patch(shifted, {m: e.source[m][:, p0:] for m in plan}, e.n)
        try:
            with torch.no_grad():
                logits = self._logits(p0, level, len(ks))
            self.forwards += 1
            return e.measure(logits, len(ks), position=0).cpu().numpy()
        finally:
            e.state.mode = CellMode.OFF

    def _logits(self, p0: int, level: int, copies: int) -> torch.Tensor:
        """[items x copies, 1, vocab]: the logits at each row's read position, positions p0.. run from block `level`."""
        e, fam = self.engine, self.family
        ids = e.base_ids[:, p0:].repeat(copies, 1)
        x = self.resid[level][:, p0:].repeat(copies, 1, 1)
        e.session.begin_step(0, ids.shape[0], None)
        h = fam.run(ids, x, level, fam.prefix(self.kv, p0, level, copies))
        rows = torch.arange(h.shape[0], device=h.device)
        at = self.reads.repeat(copies) - p0
        if ROUTES.narrow:
            return fam.head(h[rows, at][:, None])
        return fam.head(h)[rows, at][:, None]


def hooks_on(model: nn.Module) -> list[str]:
    """The modules of `model` with a forward hook or pre-hook (with_kwargs ones too), and "global" where
    torch's global ones are set: before the engine's session, hooks hookrun did not attach."""
    found = [name or type(model).__name__ for name, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks]
    module = nn.modules.module
    return found + (["global"] if module._global_forward_hooks or module._global_forward_pre_hooks else [])
