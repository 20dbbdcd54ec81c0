"""The attribution kind: every sample's attribution by one method, to the input or to a module's output
(docs/attribution.md).

    python -m hookrun experiment=attribution_shapes     # the `attribution:` block turns this kind on
    hookrun.attribute(model, dataset, method="integrated_gradients", steps=32)   # the same, in memory

| module        | what                                                                             |
|---------------|----------------------------------------------------------------------------------|
| block.py      | the block (its dataclass), checked once before the model is built                |
| kind.py       | the run kind: a step per batch, its rows as captures, the file's `attribution`   |
| engine.py     | one batch: captum's (zennit's) attribution, target, logit, prob, delta, curves; the memory budget, measured on the first batch |
| forward.py    | the model as captum calls it (attributed input first, the logits out); zennit's composites on a copy of it (LRP) |
| labels.py     | every label the run will attribute, checked before any batch where it reads without the items |
| baselines.py  | zero, mean, blur or an item key; the deletion and insertion curves to them and their areas |
| notebook.py   | hookrun.attribute: the same engine over a data set, arrays in memory             |
| reader.py     | what readers show: `open_run(p).attribution()`, the sweep table's curve areas    |

The kind is a plugin (hookrun/config/plugins.py): nothing of it is imported until a config gives the
block, a file names the kind or a notebook calls `hookrun.attribute`.
"""

from hookrun.config.plugins import KindPlugin

KIND = KindPlugin("attribution", block="hookrun.runner.kinds.attribution.block:Block",
                  run="hookrun.runner.kinds.attribution.kind:AttributionKind",
                  reader="hookrun.runner.kinds.attribution.reader:READER",
                  notebook="hookrun.runner.kinds.attribution.notebook:attribute",
                  summary="each sample's attribution by one method: saliency, integrated gradients, occlusion, Grad-CAM, LRP")
