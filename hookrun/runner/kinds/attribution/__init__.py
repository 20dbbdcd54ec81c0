"""The attribution kind: every sample's attribution by one method, to the input or to a module's output
(docs/attribution.md).

    python -m hookrun experiment=attribution_shapes     # the `attribution:` block turns this kind on
    hookrun.attribute(model, dataset, method="integrated_gradients", steps=32)   # the same, in memory

| module        | what                                                                             |
|---------------|----------------------------------------------------------------------------------|
| block.py      | the block, checked before the model is built                                     |
| kind.py       | the run kind: a step per batch, its rows as captures, the file's `attribution`   |
| engine.py     | one batch: captum's (zennit's) attribution, target, logit, prob, delta, curves; the memory budget, measured on the first batch |
| forward.py    | the model as captum calls it (attributed input first, the logits out); zennit's composites on a copy of it (LRP) |
| baselines.py  | zero, mean, blur or an item key; the deletion and insertion curves to them and their areas |
| notebook.py   | hookrun.attribute: the same engine over a data set, arrays in memory             |
| reader.py     | what readers show: `open_run(p).attribution()`, the sweep table's curve areas    |

The reader's side (reader.py) registers itself in hookrun/analysis/kind_readers.py, so readers ask the
file's kind and never name it.
"""

from hookrun.runner.kinds.attribution import kind, reader  # noqa: F401  (they register themselves)
