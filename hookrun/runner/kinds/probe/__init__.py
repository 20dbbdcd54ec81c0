"""The probe kind: one linear probe per hook point (logistic or ridge), all fitted from one pass over
the data, with Hewitt & Liang's control task (docs/probe.md).

    python -m hookrun experiment=probe_shapes hydra.run.dir=outputs/probe_shapes
    python -c "import hookrun; print(hookrun.open_run('outputs/probe_shapes').probes())"

| module      | what                                                                                 |
|-------------|--------------------------------------------------------------------------------------|
| block.py    | the `probe:` block, checked before the model is built                                |
| kind.py     | the run kind: rows per batch, the fits at the last batch, resume                     |
| collect.py  | one forward's rows at every hook point: hooks, pooling, targets, identity keys       |
| pool.py     | a feature map or token rows pooled (padding never enters)                            |
| rows.py     | the rows held within `memory`, beyond it in a spill file                              |
| moments.py  | float64 moments merged batch by batch; StandardScaler's scale; Ridge from them        |
| logistic.py | sklearn's LogisticRegression objective by full-batch L-BFGS over the rows' blocks     |
| fit.py      | one hook point's fit: split, control task, scores, weights                           |
| table.py    | the results in the file (/probe)                                                     |
| reader.py   | open_run(p).probes(), inspect's lines, plot's figure, the report's section, sweeps   |
| targets.py  | token targets from text (is_space, after_space)                                      |
| notebook.py | hookrun.probe(model, dataset, **block): the table (weights included) of a live model   |
| direction.py| the ops probe_steer / probe_ablate: steer or ablate along a probe run's weight rows    |
"""

from hookrun.config.plugins import KindPlugin

KIND = KindPlugin(
    name="probe",
    summary="one linear probe per hook point, with Hewitt & Liang's control task",
    block="hookrun.runner.kinds.probe.block:ProbeBlock",
    run="hookrun.runner.kinds.probe.kind:ProbeKind",
    reader="hookrun.runner.kinds.probe.reader:READER",
    notebook="hookrun.runner.kinds.probe.notebook:probe",
    live={"test_data": "hookrun.probe(model, dataset, test_data=items, at=[...], target=...)"},
    ops={"probe_steer": "hookrun.runner.kinds.probe.direction:probe_steer",
         "probe_ablate": "hookrun.runner.kinds.probe.direction:probe_ablate"},
)
