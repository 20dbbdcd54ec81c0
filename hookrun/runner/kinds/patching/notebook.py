"""hookrun.patch_grid: a patching block on a live model and data set, the grids returned.

    grids = hookrun.patch_grid(model, dataset, input="input", sites={"resid": {"at": "blocks.*.hook_resid_pre",
                               "over": ["position"]}})
    grids["resid"]     # xarray.DataArray, dims ("module", "position")

The same engine (runner/kinds/patching/engine.py), plan, session and actions as a file run; nothing is
written. The model comes back as it went in (its mode, flags, devices and grads; every hook and splice removed: hooks/actions/__init__.py: ModelHold).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from hookrun.config import parse_hooks
from hookrun.config.build import build, check_dataset
from hookrun.config.schema import Mode
from hookrun.errors import ConfigError, close_matches
from hookrun.hooks.actions import ActionEnv, ModelHold
from hookrun.hooks.plan import make_plan
from hookrun.runner.kinds.patching.block import Block, load_items, parse_block
from hookrun.runner.kinds.patching.checks import refuse_modifying, refuse_recording
from hookrun.runner.kinds.patching.edges.run import check_atp_ig, compute, prepare
from hookrun.runner.kinds.patching.edges.spec import EDGE_METHODS
from hookrun.runner.kinds.patching.engine import PatchEngine
from hookrun.runner.kinds.patching.forward_inputs import check_inputs
from hookrun.runner.kinds.patching.metrics import normalized
from hookrun.runner.kinds.patching.reader import as_grid, edge_grid

WHICH = ("value", "exact")
log = logging.getLogger("hookrun")


def patch_grid(model: nn.Module, dataset: Any, hooks: Any = None, limit: int | None = None, which: str = "value",
               inputs: Any = None, **block: Any) -> dict[str, Any]:
    """The grid of every site of `block` (the keys of the `patching:` config block), by site name.

    `hooks`: hookrun hooks attached as well (a splice, so that `MODULE.sae.latents` can be a site);
    `limit`: the first N items; `which="exact"`: an atp run's exactly recomputed cells (verify: K);
    `inputs`: as data.inputs, {argument: item key}: more inputs for every forward (an attention_mask);
    `metric`: as the block's (a name, {name: ..., normalize: ...}, {_target_: ...}) or a Python function
    `metric(logits, items) -> tensor of shape (items,)`, one value per item (patching averages them;
    `items` holds every item key, batched; {"name": fn, "normalize": True} normalizes it).
    method eap / eap_ig: {"edges": the [writer, reader] grid, node scores and faithfulness curve in its attrs}
    (docs/edges.md). Every argument is checked before any forward (one ConfigError); the model comes
    back unchanged.
    """
    if which not in WHICH:
        raise ConfigError(f"patch_grid: which={which!r}; choose from: {', '.join(WHICH)}" + _close(str(which), WHICH))
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"patch_grid: limit={limit!r}; give how many items to use (a whole number >= 1), or None for all")
    b = parse_block(block, build=lambda node, where: build(node, where))
    if which == "exact" and (b.method not in ("atp", "atp_ig") or not b.verify):
        raise ConfigError(f"patch_grid: which='exact' is the cells an atp run recomputes exactly (method atp or atp_ig "
                          f"with verify=K), and method={b.method!r} with verify={b.verify} recomputes none, so every cell "
                          f"would be NaN; " + ("an exact run's grid is which='value'" if b.method == "exact" else
                                               "give verify=K (the K cells of largest estimated effect), or which='value'"))
    check_forward_argument(model, b.input)
    check_inputs(b, inputs)
    with torch.inference_mode(False):  # (a caller's inference mode: atp, eap and their IG take gradients)
        return _grids(model, dataset, b, hooks, limit, which, inputs)


def _grids(model: nn.Module, dataset: Any, b: Block, hooks: Any, limit: int | None, which: str,
           inputs: Any) -> dict[str, Any]:
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    items = load_items(check_dataset(dataset, "patch_grid: got"), b, limit, device)  # (items by index, as a run's)
    env = ActionEnv(hold=ModelHold(model))  # the model comes back as it went in: hooks, splices, its mode
    try:
        points = make_plan(model, parse_hooks(hooks), env, Mode.eval)
        refuse_recording(points)
        refuse_modifying(points, b.method)
        check_atp_ig(model, b)
        if b.method in EDGE_METHODS:  # edges: runner/kinds/patching/edges/
            graph, wiring = prepare(model, b, items)
            with PatchEngine(model, b, items, env, points, inputs) as engine:
                result = compute(engine, graph, wiring)
                meta = {**grid_attrs(engine, b), **result.meta()}
            return {"edges": edge_grid(result.scores, meta)}
        with PatchEngine(model, b, items, env, points, inputs) as engine:
            values, exact = run_cells(engine)
            attrs = grid_attrs(engine, b)
    finally:
        env.close()
    layout = engine.layout.describe()
    out = exact if which == "exact" else values
    return {name: as_grid(name, out, layout, attrs) for name in layout}


def run_cells(engine: PatchEngine, cells: Sequence[int] | None = None,
              on_chunk: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """The value of each of `cells` (every cell by default; a rank's share, or those a resume has
    left) normalized where the block says, and, for atp with verify, the exact values of the
    verified cells among them (NaN elsewhere), both over the whole layout (NaN outside `cells`).
    `on_chunk(ks, values, exact)`: after each chunk (atp: one chunk, every cell of `cells`)."""
    b, size = engine.block, engine.layout.size
    cells = range(size) if cells is None else cells
    exact = np.full(size, np.nan)
    values = np.full(size, np.nan)
    if b.method in ("atp", "atp_ig"):  # the estimate of every cell is one backward: each rank makes it whole
        estimate = engine.atp()
        ks = list(cells)
        if b.verify:  # the K largest effects of the whole grid (every rank finds the same), those of `cells` recomputed
            top = set(np.argsort(-np.abs(estimate - engine.metric_base), kind="stable")[: b.verify].tolist())
            for chunk in _split([k for k in ks if k in top], engine.cells_per_forward):
                exact[chunk] = engine.exact(chunk)
        values[ks], exact[ks] = scaled(estimate, b, engine)[ks], scaled(exact, b, engine)[ks]
        if on_chunk is not None and ks:
            on_chunk(ks, values[ks], exact[ks])
        warn_nan(engine, values, ks)
        return values, exact
    for ks in engine.chunks(cells):
        values[ks] = scaled(engine.exact(ks), b, engine)
        if on_chunk is not None:
            on_chunk(ks, values[ks], exact[ks])
    warn_nan(engine, values, cells)
    return values, exact


def warn_nan(engine: PatchEngine, values: np.ndarray, cells: Sequence[int]) -> None:
    """One warning line per site with NaN cells among `cells`: which, and the likely cause."""
    ks = np.asarray(list(cells), dtype=np.int64)
    bad = ks[np.isnan(values[ks])] if len(ks) else ks
    for g in engine.layout.grids:
        mine = [int(k) for k in bad if g.offset <= k < g.offset + g.size]
        if not mine:
            continue
        where = [_cell_text(g, g.cell(k - g.offset)) for k in mine[:4]]
        log.warning("patching.sites.%s: %d of %d cell(s) are NaN (the metric %s returned NaN for some items of those "
                    "runs): %s%s", g.name, len(mine), g.size, engine.block.metric, "; ".join(where),
                    ", ..." if len(mine) > 4 else "")


def _cell_text(g: Any, cell: Any) -> str:
    return " ".join([cell.module, *(f"{a} {i}" for a, i in zip(g.over, cell.index, strict=True))])


def forward_arguments(model: nn.Module) -> tuple[list[str], bool]:
    """The named arguments of the model's forward, and whether it takes **kwargs ([], True: unknown)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return [], True
    takes = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return takes, any(p.kind is p.VAR_KEYWORD for p in params.values())


def check_forward_argument(model: nn.Module, name: str) -> None:
    """patching.input must be an argument of the model's forward (or it takes **kwargs)."""
    takes, open_kwargs = forward_arguments(model)
    if name in takes or open_kwargs:
        return
    raise ConfigError(f"patching.input={name!r} is not an argument of {type(model).__name__}.forward, which takes "
                      f"{', '.join(takes) or 'no named argument'}; set input= to the one the clean and corrupted inputs go to"
                      + _close(name, takes))


def _close(word: str, choices: Sequence[str]) -> str:
    near = close_matches(word, list(choices), n=1)
    return f"; did you mean {near[0]}?" if near else ""


def scaled(values: np.ndarray, b: Block, engine: PatchEngine) -> np.ndarray:
    return normalized(values, engine.metric_clean, engine.metric_corrupt) if b.normalize else values


def grid_attrs(engine: PatchEngine, b: Block) -> dict[str, Any]:
    return {"metric": b.metric, "method": b.method, "direction": b.direction, "metric_clean": engine.metric_clean,
            "metric_corrupt": engine.metric_corrupt, "normalize": b.normalize}


def _split(ks: list[int], n: int) -> list[list[int]]:
    return [ks[i: i + n] for i in range(0, len(ks), n)]
