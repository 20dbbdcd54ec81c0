"""The attribution kind: every sample's attribution by one method, to the input or to a module's output
(docs/attribution.md).

    python -m hookrun experiment=attribution_shapes     # the `attribution:` block turns this kind on
    hookrun.attribute(model, dataset, method="integrated_gradients", steps=32)   # the same, in memory

| module        | what                                                                             |
|---------------|----------------------------------------------------------------------------------|
| block.py      | the block, checked before the model is built                                     |
| kind.py       | the run kind: a step per batch, its rows as captures, the file's `attribution`   |
| engine.py     | one batch: captum's (zennit's) attribution, target, logit, prob, delta, curves   |
| forward.py    | the model as captum calls it (attributed input first, the logits out)            |
| baselines.py  | zero, mean, blur or an item key                                                  |
| budget.py     | the memory budget, measured on the first batch                                    |
| curves.py     | deletion and insertion curves and their areas                                    |
| lrp.py        | zennit's composites on a copy of the model, with its canonizers                  |
| notebook.py   | hookrun.attribute: the same engine over a data set, arrays in memory             |

The reader's side is hookrun/analysis/attribution.py (`open_run(p).attribution()`).
"""

from hookrun.runner.kinds.attribution import kind  # noqa: F401  (registers the kind)
