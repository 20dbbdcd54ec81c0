"""The sae kind: hookrun trains sparse dictionaries from its own caches, SAELens 6's SAETrainer the engine
(docs/sae.md).

    python -m hookrun experiment=sae_cache hydra.run.dir=outputs/h3_cache
    python -m hookrun experiment=sae_train hydra.run.dir=outputs/h3_sae     # writes saes/h3
    python -m hookrun experiment=sae_eval params.sae=saes/h3

| module    | what                                                                                |
|-----------|-------------------------------------------------------------------------------------|
| block.py  | the `sae:` block (a dataclass) and its checks that need no model                     |
| data.py   | a cache run's capture as exact [batch_rows, d_in] batches: seeded windows, epochs    |
| live.py   | on the fly (`at:`): the run's model over its data, a module's output as rows, no cache |
| engine.py | SAELens' training SAE and SAETrainerConfig from the block; the per-step figures      |
| kind.py   | the run kind: a row of figures per training step, checkpoints, resume, the SAE folder |
| prefetch.py | a cache's next batches read by a thread (device: cuda: pinned, copied while the step runs) |
| evaluation.py | `evaluate:`: the trained SAE spliced, evaluated by the evaluate kind's run on held-out items |
| reader.py | what readers show: `run.sae_curves()`, inspect's last step, plot's curves, sweep columns |
"""

from hookrun.config.plugins import KindPlugin

KIND = KindPlugin(
    name="sae",
    summary="sparse dictionaries trained from the run's own caches (SAELens the engine)",
    block="hookrun.runner.kinds.sae.block:SaeBlock",
    run="hookrun.runner.kinds.sae.kind:SaeKind",
    reader="hookrun.runner.kinds.sae.reader:READER",
)
