"""hookrun.probe: a `probe:` block on a live model and data set, its table returned (for notebooks).

    table = hookrun.probe(model, dataset, at=["layer1", "layer2"], target="label", batch_size=32)
    print(table)                         # at, rows, features, train, test, control, selectivity
    weight, bias = table.weights["layer2"]   # scores = pooled @ weight.T + bias (op: probe_steer reads these)

The same block, checks, pass and solver as a file run (`probe:` in a config): the run is written to a
temporary file, read back and removed (runner/kinds/temporary_run.py). To keep the file (for `op: probe_steer`, the report, a
sweep), give the block to `hookrun.run` with an `output.path`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import nn

from hookrun.analysis.kind_readers import Table
from hookrun.config import live_node
from hookrun.errors import ConfigError
from hookrun.runner.kinds.probe.block import LIVE_TEST
from hookrun.runner.kinds.probe.reader import probe_weights, read_probes
from hookrun.runner.kinds.temporary_run import temporary_run


@dataclass
class ProbeTable(Table):
    """run.probes()'s table, with each hook point's (weight, bias) in `weights`."""

    weights: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def probe(model: nn.Module, dataset: Any, batch_size: int = 16, inputs: Any = None, **block: Any) -> ProbeTable:
    """Fit one linear probe per hook point of `block["at"]` over `dataset` (map-style, batched in order).

    Args:
        model: any nn.Module; it stays on its device and comes back in the mode it went in.
        dataset: the items, as a file run's data (tensors, tuples or dicts; `target` names the key).
        batch_size, inputs: `data.batch_size` and `data.inputs` of a file run.
        **block: the keys of the `probe:` block (at, target, method, C, alpha, pool, standardize,
            split, test_data, control, memory): docs/probe.md. `test_data` may be a data set object
            (its items are the test rows, batched as `batch_size`) or a data node.

    Raises:
        ConfigError: a bad block or input, one line, before any batch.
    """

    def read(f: Any) -> ProbeTable:
        table = read_probes(f)
        return ProbeTable(table.columns, table.rows, {row["at"]: probe_weights(f, row["at"]) for row in table})

    target = block.get("target", "label")
    if not isinstance(target, str | int | Mapping):  # (the config's line names a _target_ node alone)
        arrays = hasattr(target, "__len__") or hasattr(target, "shape")
        raise ConfigError(f"probe: target= is an item key ('label') or {{'_target_': 'my_pkg.labels'}} (a function of the "
                          f"batch, imported by that path); got a {type(target).__name__}: " + (
                              "put each item's target in its item ({'x': x, 'label': y}) and give target='label'" if arrays
                              else "define it in a module and give {'_target_': 'module.function'}"))
    test = block.get("test_data")
    live = test is not None and not isinstance(test, Mapping)  # a data set object: the file's config names its class
    if live:
        block = {**block, "test_data": {"dataset": live_node(test)}}
    return temporary_run("probe", block, model, dataset, batch_size, inputs, read, live=(LIVE_TEST, test if live else None))
