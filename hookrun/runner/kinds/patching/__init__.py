"""Activation-patching grids: the engine behind `patching:` runs and hookrun.patch_grid.

    from hookrun.runner.kinds.patching.notebook import patch_grid
    grids = patch_grid(model, items, sites={"resid": {"at": "blocks.*.hook_resid_pre", "over": ["position"]}})

| module      | what                                                                      |
|-------------|---------------------------------------------------------------------------|
| block.py    | the `patching:` block, checked (one ConfigError per bad key)              |
| items.py    | the items as one batch, checked against the block                         |
| checks.py   | the metric's position and answer/wrong ids checked against the output     |
| cells.py    | Cell (site, module, index), SiteGrid and Layout: how cells are numbered   |
| engine.py   | PatchEngine: the base runs, exact chunks packed along the batch, atp       |
| stack.py    | the model's stack of blocks (order seen in a forward): blocks below not rerun |
| suffix.py   | the suffix route: a causal LM's cells run from their first position, cached KV |
| families.py | the models the suffix route resumes (HookedTransformer, HF GPT-2), their caches |
| budget.py   | one forward's measured bytes (cells_per_forward's default)                |
| notebook.py | patch_grid, and run_cells (shared with the file run's kind)               |
| edges/      | the residual graph, EAP / EAP-IG, atp_ig's gradients, faithfulness         |
| kind.py     | PatchingKind: the file run (`patching:` block), registered on import      |

The metrics' formulas are in runner/metrics.py; the file run is kind.py; the
grids are read back by analysis/grids.py (open_run(p).grid(name)).
"""

from hookrun.runner.kinds.patching.kind import PatchingKind  # noqa: E402  (registers the kind)

__all__ = ["PatchingKind"]
