"""The similarity kind: representational similarity (linear / rbf CKA, RSA) between every pair of hook
points of one model, or between two models on the same batches, in one pass (docs/similarity.md).

    python -m hookrun experiment=cka_resnet        # the `similarity:` block turns this kind on
    hookrun.open_run("outputs/...").similarity()   # xarray (at, with_at)

| module        | what                                                                             |
|---------------|----------------------------------------------------------------------------------|
| block.py      | the block's keys and defaults, checked before the model is built                 |
| kind.py       | the run: the second model, the route by size, a step per batch, the matrix at the end |
| features.py   | forward hooks at the `at` modules, each output pooled to (rows, features)        |
| accumulate.py | the route by size; feature-space cross-covariances, minibatch HSIC              |
| gram.py       | the sample-space route: each series' Gram matrix at the end, then the measure   |
| rows.py       | the gram route's rows: held within `memory`, else spooled; read back in slabs   |
| measures.py   | the definitions: linear CKA, rbf CKA, RSA, from Gram matrices made in place      |
| reader.py     | open_run(p).similarity(), inspect's lines, plot's heatmap, the report's section  |
| notebook.py   | hookrun.similarity(model, dataset, **block): the matrix of a live model          |
"""

from hookrun.config.plugins import KindPlugin

KIND = KindPlugin(
    name="similarity",
    summary="CKA or RSA between every pair of hook points, or between two models",
    block="hookrun.runner.kinds.similarity.block:SimilarityBlock",
    run="hookrun.runner.kinds.similarity.kind:SimilarityKind",
    reader="hookrun.runner.kinds.similarity.reader:READER",
    notebook="hookrun.runner.kinds.similarity.notebook:similarity",
    live={"with.model": "hookrun.similarity(model, dataset, with_={'model': module, 'at': [...]}, at=[...])"},
)
