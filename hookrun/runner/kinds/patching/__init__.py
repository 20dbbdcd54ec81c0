"""Activation-patching grids: the engine behind `patching:` runs and hookrun.patch_grid.

    from hookrun.runner.kinds.patching.notebook import patch_grid
    grids = patch_grid(model, items, sites={"resid": {"at": "blocks.*.hook_resid_pre", "over": ["position"]}})

| module      | what                                                                      |
|-------------|---------------------------------------------------------------------------|
| block.py    | the `patching:` block (PatchingConfig), checked once (one ConfigError per bad key), and the items as one batch, checked against it |
| checks.py   | the metric's position and answer/wrong ids checked against the output     |
| cell_action.py | PatchCells, the action on every site: keep, patch or read each site's output per cell |
| cells.py    | Cell (site, module, index), SiteGrid and Layout: how cells are numbered   |
| engine.py   | PatchEngine: the base runs, exact chunks packed along the batch, atp       |
| stack.py    | the model's stack of blocks (order seen in a forward): blocks below not rerun |
| metrics.py  | the metrics per item (logit_diff, logprob, prob, ce, kl, logit), normalized |
| suffix.py   | the suffix route: a causal LM's cells run from their first position, cached KV |
| families.py | the models the suffix route resumes (HookedTransformer, HF GPT-2), their caches |
| notebook.py | patch_grid, and run_cells (shared with the file run's kind)               |
| edges/      | the residual graph, EAP / EAP-IG, atp_ig's gradients, faithfulness         |
| kind.py     | PatchingKind: the file run (`patching:` block)                             |
| reader.py   | what readers show of it: run.grids, run.grid(name), run.edges(), inspect's lines |
| report.py   | its pictures (report and plot): a heatmap per grid plane, atp against exact, circuits |

One forward's measured bytes (cells_per_forward's default) come from runner/memory.py. The kind is a
plugin (hookrun/config/plugins.py): nothing of it is imported until a config gives the block, a file
names the kind or a notebook calls `hookrun.patch_grid`.
"""

from hookrun.config.plugins import KindPlugin

KIND = KindPlugin("patching", block="hookrun.runner.kinds.patching.block:PatchingConfig",
                  run="hookrun.runner.kinds.patching.kind:PatchingKind",
                  reader="hookrun.runner.kinds.patching.reader:READER",
                  notebook="hookrun.runner.kinds.patching.notebook:patch_grid",
                  summary="activation-patching grids; circuit edges by EAP or EAP-IG, with faithfulness")
