"""The patching engine: exact grids packed many cells to a forward, and attribution patching.

    with PatchEngine(model, block, items, env) as engine:   # the clean and corrupted runs, every check
        values = np.concatenate([engine.exact(ks) for ks in engine.chunks()])   # or engine.atp()

The sites are hooked through the same plan (make_plan), session (HookSession) and action
(cell_action.py, a hooks action) as every hookrun run. What it does:

- the base run (the corrupted input for direction=denoise, the clean one for noise) and the source
  run (the other) each once, keeping every site's output; they give metric_clean, metric_corrupt,
  each site's modules and axes (checked: a site that never fires, an `over` axis its tensor lacks),
  and the bytes one copy of the items' forward allocates (the cells_per_forward default);
- exact: a chunk of c cells is one forward of the base input repeated c times, copy j patched at
  cell j with the source run's values; the blocks below the lowest patched block are not run (they
  return the base run's outputs, runner/kinds/patching/stack.py). A cell's value: the metric averaged
  over the items of its copy. On a causal LM the chunk runs from its first patched position on
  (runner/kinds/patching/suffix.py);
- atp: one forward of the base input with zeros added at every site (their gradient is the
  metric's), one backward: a cell's value is metric(base) + sum over the cell of
  (source - base) * d metric / d activation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from hookrun.config import parse_hooks
from hookrun.errors import ConfigError, HookrunError, RunError
from hookrun.hooks import HOOK_TYPES, HookPoint
from hookrun.hooks.actions import ActionEnv
from hookrun.hooks.actions.rows import meaning
from hookrun.hooks.plan import make_plan
from hookrun.hooks.session import HookSession
from hookrun.runner.calls import model_forward
from hookrun.runner.kinds.patching.block import Block
from hookrun.runner.kinds.patching.cell_action import CellMode, PatchCells, PatchState
from hookrun.runner.kinds.patching.cells import Layout, SiteGrid
from hookrun.runner.kinds.patching.checks import check_ce, check_metric_inputs, check_token_ids
from hookrun.runner.kinds.patching.forward_inputs import ForwardCall
from hookrun.runner.kinds.patching.forward_inputs import repeat_items as _repeat
from hookrun.runner.kinds.patching.metrics import item_metric, reference_logprobs, user_metric
from hookrun.runner.kinds.patching.stack import BlockStack
from hookrun.runner.kinds.patching.suffix import SuffixRoute, hooks_on
from hookrun.runner.losses import pick_output
from hookrun.runner.memory import measure_bytes
from hookrun.runner.token_inputs import with_positions

SPEC = "patching_site_"  # the site's hook name in the plan (errors are renamed to patching.sites.NAME)


class PatchEngine:
    skip_equal = True  # cells whose source equals the base run take metric_base (benchmarks/patching.py turns it off)

    def __init__(self, model: nn.Module, block: Block, items: Mapping[str, torch.Tensor], env: ActionEnv,
                 points: list | None = None, inputs: Any = None) -> None:
        self.model, self.block, self.env = model, block, env
        self.items = dict(items)
        self.call = ForwardCall(block, inputs, self.items)  # data.inputs beside the ids (an attention_mask)
        self.foreign_hooks = hooks_on(model)  # hooks hookrun did not attach (a user's own): no suffix route
        self.state = PatchState()
        self.site_points = self._plan()
        self.session = HookSession([*(points or []), *self.site_points], env)
        self.extra_points = bool(points)  # other hooks see every forward: no suffix route (suffix.py)
        self.route: SuffixRoute | None = None
        self.full_forwards = self.equal_cells = 0  # whole-input forwards (the route's: route.forwards); cells not run
        self.stack = BlockStack.find(model)
        noise = block.direction == "noise"
        self.base_ids = self.items[block.clean if noise else block.corrupt]
        self.source_ids = self.items[block.corrupt if noise else block.clean]
        self.n = self.base_ids.shape[0]
        self.cells_per_forward = block.cells_per_forward

    # -- setting up: the two runs and every check -------------------------------------------------
    def __enter__(self) -> PatchEngine:
        self.session.__enter__()
        try:
            self._base_runs()
        except BaseException:
            self.session.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.state.mode = CellMode.OFF
        self.session.__exit__(*exc)

    def _plan(self) -> list:
        specs = parse_hooks({f"{SPEC}{s.name}": {"at": list(s.at), "type": "forward", "actions": []} for s in self.block.sites})
        try:
            points = make_plan(self.model, specs, self.env, "eval")
        except HookrunError as exc:
            raise type(exc)(str(exc).replace(f"hooks.{SPEC}", "patching.sites.")) from None
        hook_type = HOOK_TYPES.get("forward")
        for p in points:
            p.actions.append(PatchCells(p, hook_type, self.env, where=f"patching.sites.{p.hook[len(SPEC):]}", state=self.state))
        return points

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.session.begin_step(0, ids.shape[0], None)
        kw = self.call(ids)
        return pick_output(model_forward(self.model, (), with_positions(self.model, kw, kw.get("attention_mask")), kw), None, "patching")

    def measure(self, logits: torch.Tensor, copies: int, position: int | None = None) -> torch.Tensor:
        """The metric of each copy: its items' values averaged (float64); `position` overrides the block's."""
        b = self.block
        rep = {k: _repeat(v, copies) for k, v in self.items.items()} if copies > 1 else self.items
        if b.user_metric is not None:
            value = user_metric(b.user_metric, b.metric, logits, rep)
            if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.shape[0] != logits.shape[0]:
                got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
                raise ConfigError(f"patching.metric {b.metric}: returned {got}; it must return one value per item, a "
                                  f"tensor of shape ({logits.shape[0]},): patching averages it over the items itself "
                                  f"(a scalar, such as a .mean() over the batch, would mix the cells packed into one forward)")
        else:
            ref = self.reference.repeat(copies, 1) if self.reference is not None else None
            ids = _repeat(self.items[b.clean], copies)
            value = item_metric(b.metric, logits, rep, b.position if position is None else position, b.answer, b.wrong, ids, ref,
                                rep.get(self.call.mask_key) if self.call.mask_key else None)
        return value.detach().double().view(copies, -1).mean(1) if not value.requires_grad else value.double().view(copies, -1).mean(1)

    def _base_runs(self) -> None:
        b, state = self.block, self.state
        self.model.eval()
        self.reference = None
        with torch.no_grad():
            state.mode, state.kept = CellMode.KEEP, {}
            check_token_ids(self.model, self.items, (b.clean, b.corrupt))
            check_ce(b, self.items, self.call.mask_key)
            source_logits = self.forward(self.source_ids)
            check_metric_inputs(b, source_logits, self.items, self.call.mask_key)
            self.source = state.kept
            state.kept = {}
            run = lambda: self.forward(self.base_ids)  # noqa: E731
            watch = [p.module for p in self.site_points]
            base_run = (lambda: self.stack.keep_outputs(run, watch)) if self.stack is not None else run
            base_logits, self.copy_bytes = measure_bytes(self.model, base_run)
            self.base = state.kept
            state.mode = CellMode.OFF
            clean_logits, corrupt_logits = (base_logits, source_logits) if b.direction == "noise" else (source_logits, base_logits)
            if b.user_metric is None and b.metric == "kl":
                self.reference = reference_logprobs(clean_logits, self.items, b.position)
            self.metric_clean = float(self.measure(clean_logits, 1)[0])
            self.metric_corrupt = float(self.measure(corrupt_logits, 1)[0])
        self.metric_base = self.metric_clean if b.direction == "noise" else self.metric_corrupt
        if b.normalize and not self.metric_clean != self.metric_corrupt:
            raise ConfigError(f"patching.metric.normalize: the metric is {self.metric_clean} on the clean input and "
                              f"{self.metric_corrupt} on the corrupted one, so (m - m_corrupt) / (m_clean - m_corrupt) is "
                              f"undefined in every cell; choose items whose clean and corrupted runs differ, or normalize: false")
        self.layout = Layout(self._grids())
        self.route = SuffixRoute.find(self, base_logits)
        if self.cells_per_forward is None:
            self.cells_per_forward = max(1, min(self.layout.size, b.memory // max(1, self.copy_bytes)))

    def _grids(self) -> list[SiteGrid]:
        grids, offset = [], 0
        for site in self.block.sites:
            where = f"patching.sites.{site.name}"
            points = [(p, name) for q in self.site_points if q.hook == SPEC + site.name for p, name in self._fired(q)]
            silent = [p.module for p in self.site_points if p.hook == SPEC + site.name and not self._fired(p)]
            if silent:
                raise ConfigError(f"{where}.at: {', '.join(silent)} never fired (or returned no tensor) in a forward of "
                                  f"{self.block.input}; patch modules that run on this input (hookrun.modules(model, x) lists them)")
            sizes = None
            for p, name in points:
                x = self.source[name]
                dims = site.dims or self._dims(p, x)
                if len(dims) != x.dim():
                    raise ConfigError(f"{where}.dims={list(dims)}: {name}'s output has {x.dim()} axes {tuple(x.shape)}; name each once")
                missing = [a for a in site.over if a not in dims]
                if missing:
                    raise ConfigError(f"{where}.over: {', '.join(map(repr, missing))} is not an axis of {name}'s output "
                                      f"(shape {tuple(x.shape)}, axes {', '.join(dims)}); cut along {', '.join(dims[1:])}, "
                                      f"or name its axes with dims: [sample, ...]")
                s = tuple(x.shape[dims.index(a)] for a in site.over)
                if sizes is not None and s != sizes:
                    raise ConfigError(f"{where}: its modules' {list(site.over)} differ in size ({sizes} and {s} at {name}); "
                                      f"split them into sites of their own")
                sizes, site_dims = s, dims
            grids.append(SiteGrid(site.name, tuple(name for _, name in points), site.over, site_dims, sizes, offset))
            offset += grids[-1].size
        return grids

    def _fired(self, point: HookPoint) -> list[tuple[Any, str]]:
        """(point, the name its output was kept under) for each firing: the point's module, or, for an op
        site spelt without its call (MODULE/FN, as capture() takes it), each call MODULE/FN.k that ran."""
        if point.module in self.source:
            return [(point, point.module)]
        if "/" not in point.module:
            return []
        head = point.module + "."
        calls = sorted(int(k[len(head):]) for k in self.source if k.startswith(head) and k[len(head):].isdigit())
        return [(point, f"{head}{k}") for k in calls]

    def _dims(self, point: HookPoint, x: torch.Tensor) -> tuple[str, ...]:
        """(sample, position, feature) / (sample, position, head, feature) over the input's tokens,
        else the names record gives (hooks/actions/rows.py), its `token` called `position`."""
        if x.dim() in (3, 4) and x.shape[1] == self.base_ids.shape[1] and self.base_ids.dim() == 2:
            return ("sample", "position", "feature") if x.dim() == 3 else ("sample", "position", "head", "feature")
        return tuple("position" if d == "token" else d for d in meaning(point, "output", tuple(x.shape), self.env.state))

    # -- exact ------------------------------------------------------------------------------------
    def chunks(self, cells: Iterable[int] | None = None) -> Iterator[list[int]]:
        """`cells` (every cell by default) in order, at most cells_per_forward a chunk; where the model is
        a stack of blocks a chunk holds one block's cells only (a chunk of block L runs blocks L.. alone);
        on the suffix route a chunk is also cut where its cells' positions spread too far (SuffixRoute.cut)."""
        chunk: list[int] = []
        level = start = None
        for k in range(self.layout.size) if cells is None else cells:
            here = self._level(k)
            at = self.route.start(k) if self.route is not None else None
            cut = at is not None and start is not None and self.route.cut(start, at, len(chunk) * self.n)
            if chunk and (len(chunk) == self.cells_per_forward or here != level or cut):
                yield chunk
                chunk = []
            if not chunk:
                start = at
            chunk.append(k)
            level = here
        if chunk:
            yield chunk

    def _level(self, k: int) -> int:
        if self.stack is None or not self.stack.ordered:
            return 0
        grid = self.layout.grid_of(k)
        return self.stack.level(grid.modules[(k - grid.offset) // max(1, int(np.prod(grid.sizes)))])

    def exact(self, ks: list[int]) -> np.ndarray:
        """The metric with each cell of `ks` patched, one copy of the items per cell, in one forward. A cell
        whose source values equal the base run's (every element) leaves the base run as it is: metric_base,
        no forward (a causal model's positions before the first token the inputs differ at)."""
        same = np.array([self.skip_equal and self.layout.unchanged(k, self.source, self.base) for k in ks], dtype=bool)
        if not same.any():
            return self._exact(ks)
        out, self.equal_cells = np.full(len(ks), self.metric_base), self.equal_cells + int(same.sum())
        if not same.all():
            out[~same] = self._exact([k for k, s in zip(ks, same, strict=True) if not s])
        return out

    def _exact(self, ks: list[int]) -> np.ndarray:
        plan: dict[str, list] = {}
        level = len(self.stack) if self.stack is not None else 0
        for copy, k in enumerate(ks):
            grid = self.layout.grid_of(k)
            cell = grid.cell(k - grid.offset)
            plan.setdefault(cell.module, []).append((copy, grid.tensor_index(cell)))
            if self.stack is not None:
                level = min(level, self.stack.level(cell.module))
        fast = self.route.exact(ks, plan) if self.route is not None else None
        if fast is not None:
            return fast
        self.full_forwards += 1
        self.state.begin_patch(plan, self.source, self.n)
        try:
            with torch.no_grad():
                if self.stack is not None:
                    with self.stack.skip_below(level, len(ks)):
                        logits = self.forward(_repeat(self.base_ids, len(ks)))
                else:
                    logits = self.forward(_repeat(self.base_ids, len(ks)))
                return self.measure(logits, len(ks)).cpu().numpy()
        finally:
            self.state.mode = CellMode.OFF

    # -- attribution patching ---------------------------------------------------------------------
    def atp(self) -> np.ndarray:
        """metric(base) + sum over each cell of (source - base) * d metric / d activation, every cell."""
        state = self.state
        if self.block.method == "atp_ig":  # the gradient averaged over the interpolated runs (runner/kinds/patching/edges/eap.py)
            from hookrun.runner.kinds.patching.edges.eap import atp_ig_grads

            grads = atp_ig_grads(self)
        else:
            state.mode, state.deltas = CellMode.GRAD, {}
            try:
                with torch.enable_grad():
                    metric = self.measure(self.forward(self.base_ids), 1)[0]
            finally:
                state.mode = CellMode.OFF
            modules = list(state.deltas)
            grads = dict(zip(modules, torch.autograd.grad(metric, [state.deltas[m] for m in modules], allow_unused=True), strict=True))
        state.deltas = {}
        out = np.empty(self.layout.size)
        for g in self.layout.grids:
            axes = [g.dims.index(a) for a in g.over]
            rest = [i for i in range(len(g.dims)) if i not in axes]
            for j, module in enumerate(g.modules):
                grad = grads.get(module)
                if grad is None:
                    raise RunError(f"patching.sites.{g.name}: {module}'s output is not on the metric's gradient path")
                terms = ((self.source[module] - self.base[module]).double() * grad.double()).permute(*axes, *rest)
                cell_sums = terms.sum(dim=tuple(range(len(axes), len(g.dims))))
                n = int(np.prod(g.sizes))
                out[g.offset + j * n: g.offset + (j + 1) * n] = (self.metric_base + cell_sums.detach().cpu().numpy().reshape(-1))
        return out
