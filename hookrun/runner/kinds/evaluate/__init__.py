"""The evaluate kind, whole: its block and refusals (block.py), forwards (kind.py), metrics
(metrics.py), ablations (ablations.py), its table under /evaluation (table.py) and what readers
show of it (reader.py).

    python -m hookrun experiment=resnet_layer1 evaluate.ablation=zero loss=cross_entropy
    python -c "import hookrun; print(hookrun.open_run('outputs/.../captures.h5').evaluation())"

The kind is a plugin (hookrun/config/plugins.py): nothing of it is imported until a config gives the
block (a key of it on the command line adds the block) or a file names the kind; kind.py imports
its table (store/records.py registers it), the plugin's reader is reader.py's READER.
"""

from hookrun.config.plugins import KindPlugin

KIND = KindPlugin("evaluate", block="hookrun.runner.kinds.evaluate.block:EvaluateBlock",
                  run="hookrun.runner.kinds.evaluate.kind:EvaluateKind",
                  reader="hookrun.runner.kinds.evaluate.reader:READER", added_by_key=True,
                  summary="the clean and the intervened forward of every batch (an ablated one too), and their metrics")
