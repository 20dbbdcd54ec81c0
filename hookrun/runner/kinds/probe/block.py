"""The `probe:` block: its keys, types and defaults, and the value checks that need no model.

    probe: {at: [block1, block2, block3], target: label, method: logistic, C: 1.0, control: true}

Parsed once by hookrun.config.load (hookrun/config/plugins.py) into ProbeBlock; `check()`
raises one ConfigError line per wrong value and turns `memory` into bytes. What needs the model or
the first batch (a hook point with no feature axis, a target key the items lack, a float target with
logistic, a budget too small for one batch) is checked by the kind (kind.py) before any batch.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from hookrun.errors import ConfigError, close_matches, parse_bytes

METHODS = ("logistic", "ridge")
# hookrun.probe(..., test_data=DATASET): the live test set, handed to the kind for one run (notebook.py sets
# it; the block's node says {dataset: {live: package.Class}}, as run(cfg, dataset=d)'s data.dataset does)
LIVE_TEST: ContextVar[Any] = ContextVar("probe_live_test", default=None)
POOLS = ("mean", "max", "last", "every")


@dataclass
class Split:
    test: float = 0.25  # the fraction of items held out (sklearn's train_test_split test_size)
    seed: int = 0  # its random_state; also the control task's seed


@dataclass
class ProbeBlock:
    at: Any = None  # a module path or glob, or a list of them
    target: Any = "label"  # an item key (`label`: the data's target), or {_target_: fn}: fn(batch) -> targets
    method: str = "logistic"  # logistic (C) | ridge (alpha)
    C: float = 1.0
    alpha: float = 1.0
    pool: str = "mean"  # feature maps: mean | max; token rows: last | mean | max | every
    standardize: bool = True
    split: Split = field(default_factory=Split)
    test_data: Any = None  # a data node ({dataset: {_target_: ...}, batch_size: N}) whose items are the test rows
    control: bool = False  # Hewitt & Liang's control task and the selectivity
    memory: Any = "2GB"  # bytes of rows held in memory; beyond: a spill file beside the run's
    max_iter: int = 10000  # logistic: L-BFGS iterations at most (a fit stopped there is logged and marked)

    def check(self) -> None:
        at = [self.at] if isinstance(self.at, str) else self.at
        if not at or not all(isinstance(a, str) and a for a in at):
            raise ConfigError(f"probe.at={self.at!r}: give the hook points to probe, a module path or glob or a "
                              f"list of them (e.g. [layer1, layer2]; `python -m hookrun.modules` lists them)")
        self.at = list(at)
        if self.method not in METHODS:
            raise ConfigError(f"probe.method={self.method!r}; choose logistic or ridge")
        if not self.C > 0:
            raise ConfigError(f"probe.C={self.C}: the inverse regularisation strength must be above 0 (e.g. 1.0)")
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, int) or self.max_iter < 1:
            raise ConfigError(f"probe.max_iter={self.max_iter!r}: the logistic solver's iterations at most, a whole "
                              f"number of 1 or more (e.g. 10000)")
        if not 0 <= self.alpha < float("inf"):  # (inf passed, ran the pass and ended in scipy's 'infs or NaNs' traceback)
            raise ConfigError(f"probe.alpha={self.alpha}: ridge's penalty must be a finite number, 0 or more (e.g. 1.0), "
                              f"as sklearn's Ridge takes it")
        if self.pool not in POOLS:
            raise ConfigError(f"probe.pool={self.pool!r}; choose mean, max (feature maps, token rows), last or every "
                              f"(token rows)")
        if not 0 < self.split.test < 1:
            raise ConfigError(f"probe.split.test={self.split.test}: the fraction of items held out must be in (0, 1) "
                              f"(e.g. 0.25)")
        if not (isinstance(self.split.seed, int) and 0 <= self.split.seed < 2**32):
            raise ConfigError(f"probe.split.seed={self.split.seed!r}: the split's random_state must be an integer "
                              f"in [0, 2**32) (e.g. 0)")
        target = self.target
        if isinstance(target, dict) and not target.get("_target_"):
            raise ConfigError(f"probe.target={target!r}: give an item key, or {{_target_: my_pkg.labels}} (a function "
                              f"of the batch returning one target per item or per token)")
        if not isinstance(target, str | int | dict):
            raise ConfigError(f"probe.target={target!r}: give an item key (label), or {{_target_: my_pkg.labels}}")
        if self.test_data is not None and self.split.test != Split.test:  # test_data is the test set: no split is made
            raise ConfigError(f"probe.split.test={self.split.test} beside probe.test_data: the test rows are test_data's "
                              f"items and no split is made; drop split.test (split.seed still seeds the control task)")
        if self.test_data is not None and not isinstance(self.test_data, dict):
            raise ConfigError(f"probe.test_data={self.test_data!r}: give a data node, {{dataset: {{_target_: ...}}, "
                              f"batch_size: 16}}")
        extra = sorted(set(self.test_data) - {"dataset", "batch_size"}) if isinstance(self.test_data, dict) and \
            "dataset" in self.test_data else []
        if extra:  # (limit, num_workers, a misspelt batch_size: were ignored in silence)
            hint = close_matches(str(extra[0]), ["dataset", "batch_size"], n=1)
            raise ConfigError(f"probe.test_data.{extra[0]}: not a key of the test data node, whose keys are dataset and "
                              f"batch_size" + (f"; did you mean probe.test_data.{hint[0]}?" if hint else
                                               " (every test item is used; give fewer items in the dataset node)"))
        size = self.test_data.get("batch_size") if isinstance(self.test_data, dict) else None
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigError(f"probe.test_data.batch_size={size!r}: a whole number of 1 or more (or leave it out: "
                              f"data.batch_size)")  # ('abc' was a traceback, 0 data.batch_size, 2.5 two, -1 'data.batch_size')
        live = isinstance(self.test_data, dict) and "live" in (self.test_data.get("dataset") or {})
        if live and LIVE_TEST.get() is None:
            raise ConfigError(f"probe.test_data={self.test_data!r} names a live data set, which only "
                              f"hookrun.probe(model, data, test_data=DATASET) hands over; in a config give "
                              f"{{dataset: {{_target_: package.module.Name}}}}")
        self.memory = parse_bytes(self.memory, "probe.memory")
