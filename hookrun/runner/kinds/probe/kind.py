"""The probe run kind: one forward per batch with the `at` modules hooked, each hook point's rows
pooled and kept (rows.py), every probe fitted at the last batch and written with it (table.py).

    python -m hookrun experiment=probe_shapes hydra.run.dir=outputs/probe_shapes
    hookrun.open_run("outputs/probe_shapes").probes()      # Table: at, train, test, control, selectivity, majority

Before any batch, on the first batch: the modules resolve, their outputs have a feature axis, the
target key exists and suits the method, one batch's rows fit `memory` (its share per hook point),
the run's items, and the split's training items, hold 2 classes or more where the data set lists its
targets (else checked at the end of the pass, before any solver).
User hooks (`hooks:`) record in the same forward. A resumed run recomputes the rows of the batches
it keeps (their forwards, not the file's) and goes on, so its probes equal an uninterrupted run's.
Many ranks (torchrun) run contiguous blocks of the batches; after its pass each rank but 0 saves
its rows to a file (save_rows) that RankLink.hand_over (output/rank_link.py) passes to rank 0, whose
RankLink.gather adds them (load_rows) in batch order at its last batch, before the fit: the
one-process rows, blocks and probes. Resumed, a rank recomputes the rows it kept and hands them over
again, also where its shard was complete (rejoin), while rank 0's shard is not.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError, RunError
from hookrun.output.rank_link import RankLink
from hookrun.output.scratch import Scratch
from hookrun.runner.extra_forwards import first_batch, replay
from hookrun.runner.kinds import NOTHING, KindContext, RunKind, StepAdds
from hookrun.runner.kinds.probe.block import LIVE_TEST
from hookrun.runner.kinds.probe.collect import Collector, check_rows
from hookrun.runner.kinds.probe.fit import FitSpec, fit_point, test_rows, training_classes
from hookrun.runner.kinds.probe.rows import RowStore
from hookrun.runner.kinds.probe.table import GROUP, class_count, plan, probe_bytes

log = logging.getLogger("hookrun")


class ProbeKind(RunKind):
    adds = (GROUP,)
    hands_over = True

    @classmethod
    def check(cls, cfg: HookrunConfig) -> None:
        if cfg.mode is not Mode.eval:
            raise ConfigError(f"probe with mode={cfg.mode.value}: a probe needs one forward per batch; leave mode=eval")
        import importlib.util
        missing = [m for m in ("scipy", "threadpoolctl") if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(f"probe: its solvers run on scipy (L-BFGS-B, linear algebra) with threadpoolctl (BLAS "
                              f"threads); not installed: {', '.join(missing)}: pip install 'hookrun[represent]'")

    def __init__(self, ctx: KindContext) -> None:
        super().__init__(ctx)
        b = self.spec = ctx.cfg.probe
        ctx.model.eval()
        self.collector = Collector(ctx.model, b.at, b)
        if b.test_data is None:
            refuse_an_empty_training_split(b.split.test, len(ctx.env.planned_samples))
        self.names = self.collector.taps.names
        indices, call = first_batch(ctx.loader, ctx.spec, size=ctx.cfg.data.batch_size)
        first = self.collector.batch(ctx.model, call.to(ctx.device), indices)
        share = b.memory // len(self.names)
        for _, y, _, _ in first.values():
            if y.dtype.kind == "f" and b.method == "logistic":
                raise ConfigError("probe.target: the targets are numbers (floats), which method=logistic cannot fit; use "
                                  "method: ridge for regression, or give integer classes")
            if y.dtype.kind == "f" and b.control:
                raise ConfigError("probe.control=true needs class targets; the targets are numbers (floats): set "
                                  "control: false for a regression probe")
        name, need = max(((n, v[0].numel() * 8) for n, v in first.items()), key=lambda t: t[1])  # the widest point
        if need > share:
            raise ConfigError(f"probe.memory={b.memory} bytes: one batch's rows at {name} take {need} bytes (float64) "
                              f"and each of the {len(self.names)} hook point(s) has {share}; give probe.memory at "
                              f"least {need * len(self.names)} bytes, or a smaller data.batch_size")
        data = getattr(ctx.loader.dataset, "dataset", None)
        classes = getattr(data, "classes", None)
        if isinstance(classes, list | tuple) and b.target in ("label", "target") and len(classes) < 2:
            raise ConfigError(f"probe.target={b.target}: the data set has {len(classes)} class(es); a probe needs at least 2")
        limit = ctx.cfg.data.limit
        known = listed_targets(data, len(ctx.env.planned_samples))
        if b.target in ("label", "target") and known is not None and len(np.unique(known)) < 2:
            raise ConfigError(f"probe.target={b.target}: the run's items hold {len(np.unique(known))} class(es) ({np.unique(known).tolist()}); "
                              "a probe needs at least 2: probe more items or other data")
        if b.target in ("label", "target") and known is not None and b.test_data is None and limit is None:
            test = test_rows(np.arange(len(known)), b.split.test, b.split.seed)  # every item runs: known before a batch
            training_classes(known, ~test)
        self.names, self.features = self.collector.taps.names, {n: v[0].shape[1] for n, v in first.items()}  # (outputs' order)
        self.y_kind = first[self.names[0]][1].dtype.kind  # the targets': f (values) or i (classes)
        self.classes = class_count(self.y_kind, classes, known, data)  # (for file_bytes; 0: not known before the pass)
        self.first = (indices, first)  # batch 0's rows: its step uses them where no user hook needs its forward
        self.tests = self.test_loader() if b.test_data is not None else None
        self.stores: dict[str, RowStore] = {}
        self.last = -1
        self.rank, self.world, self.link, self.begin, self.points, self.tmp = 0, 1, None, 0, [], None
        self.should_stop = lambda: False

    def share(self, rank: int, world: int) -> str | None:
        self.rank, self.world = rank, world
        return None

    def join_ranks(self, link: Any) -> None:
        self.link = link

    def prepare_run(self, p: Any) -> None:
        self.last, self.begin, self.points = p.batches.stop - 1, p.batches.start, p.points
        self.should_stop = lambda: p.settings.should_stop()
        RankLink.require(self.link, self.world, "probe", self.rank, self.should_stop)  # (the folder every rank sees)
        self.tmp = Scratch(p.cfg.output, "probe_rows", self.rank)  # the spill file's folder, beside the run's
        share = self.spec.memory // len(self.names)
        self.stores = {n: RowStore(self.features[n], share, self.tmp.path / f"p{i:03d}.rows", n)
                       for i, n in enumerate(self.names)}
        p.attrs[GROUP] = json.dumps(self.describe())

    def describe(self) -> dict:
        b = self.spec
        return {"at": self.names, "target": b.target, "method": b.method, "C": b.C, "alpha": b.alpha, "pool": b.pool,
                "standardize": b.standardize, "split": {"test": b.split.test, "seed": b.split.seed},
                "test_data": b.test_data is not None, "control": b.control, "memory": b.memory}

    def add(self, model: nn.Module, call: Any, indices: Any, part: int = 0, session: Any = None) -> None:
        first, self.first = self.first, None
        if first is not None and not part and not self.ctx.points and torch.equal(first[0].cpu(), indices.cpu()):
            rows = first[1]  # (computed by __init__'s check on the same batch)
        else:
            rows = self.collector.batch(model, call, indices, replay=session)  # (test_data's: records off)
        check_rows(rows, self.features, self.y_kind, part)
        for name, (x, y, key, item) in rows.items():
            if part:  # test_data's items: identities of their own (a token id is the same token's in both)
                key, item = key if self.collector.by_token[name] else -1 - key, -1 - item
            self.stores[name].add(x, y, key, item, part)

    def step(self, model: nn.Module, call: Any, session: Any) -> StepAdds:
        state = self.ctx.env.state
        self.add(model, call, state.sample_index)
        if state.step != self.last or self.rank:
            return NOTHING  # (a rank but 0 hands its rows to rank 0 after its pass: run_steps)
        if self.world > 1:
            self.link.gather("probe", self.load_rows, self.should_stop)
            log.info("probe: the rows of %d rank(s) merged", self.world)
        return StepAdds(tables={GROUP: self.fit(model, session)})

    def sample_step(self, model: nn.Module, call: Any, session: Any) -> StepAdds:
        """The dry-run estimate's step: `step`'s forward (the user's hooks fire), its rows dropped: a dry
        run prepares no row store (prepare_run would make the spill folder beside the run's file)."""
        self.collector.batch(model, call, self.ctx.env.state.sample_index)
        return NOTHING

    def run_steps(self, data_loop: Any, writer: Any, first_row: int, should_stop: Any) -> int:
        """The data loop; then a rank but 0 hands its rows to rank 0 (also where a resume kept its last batch)."""
        steps = data_loop()
        if self.rank and not should_stop():
            self.link.hand_over("probe", self.save_rows, should_stop)
        return steps

    def rejoin(self, resume: Any, kept: int) -> None:
        """A rank but 0 whose shard was complete, resumed: its rows recomputed and handed to rank 0 again,
        where rank 0 still gathers."""
        self.link.rejoin("probe", lambda: self.restore(resume, kept), self.save_rows, self.should_stop)

    def save_rows(self, path: Path) -> None:
        """This rank's rows, every hook point's, to one HDF5 file at `path` (a group per hook point)."""
        import h5py

        with h5py.File(path, "w") as f:
            for i, name in enumerate(self.names):
                self.stores[name].save(f.create_group(f"{i:03d}"))

    def load_rows(self, path: Path) -> None:
        """Another rank's rows (save_rows' file at `path`), added after this rank's."""
        import h5py

        with h5py.File(path, "r") as f:
            for i, name in enumerate(self.names):
                self.stores[name].load(f[f"{i:03d}"])

    def fit(self, model: nn.Module, session: Any = None) -> dict:
        b = self.spec
        y = self.stores[self.names[0]].column("y")
        if y.dtype.kind != "f" and len(np.unique(y)) < 2:  # (before test_data's pass and any solver)
            raise ConfigError(f"probe.target={b.target}: the data's targets hold {len(np.unique(y))} class(es) ({np.unique(y).tolist()}) "
                              f"over {len(y)} rows; a probe needs at least 2: probe more items or another target")
        if b.test_data is not None:
            self.test_pass(model, session)
        spec = FitSpec(method=b.method, C=b.C, alpha=b.alpha, standardize=b.standardize, max_iter=b.max_iter,
                       test=None if b.test_data is not None else b.split.test, seed=b.split.seed, control=b.control)
        points = []
        for name in self.names:
            log.info("probe: fitting %s (%d rows of %d features, %s)", name, self.stores[name].rows,
                     self.features[name], "spilled to disk" if self.stores[name].spilled else "in memory")
            t0 = time.perf_counter()
            result = fit_point(self.stores[name], spec, self.ctx.device, where=f" at {name}")
            points.append((name, {**result, "fit_seconds": time.perf_counter() - t0}))
            if result.get("converged") is False:  # (scikit-learn's ConvergenceWarning)
                log.warning("probe: the logistic fit at %s stopped after %d iterations without converging (its "
                            "objective %.10g is not shown to be the optimum, nor its weights); raise probe.max_iter, "
                            "or standardize: true, or a smaller C", name, result["iterations"], result["objective"])
            if result.get("control_converged") is False:
                log.warning("probe: the control task's logistic fit at %s stopped after %d iterations without "
                            "converging: its accuracy and the selectivity are not the optimum's; raise probe.max_iter, "
                            "or standardize: true, or a smaller C", name, result["control_iterations"])
        regression = points[0][1]["regression"]
        unseen = points[0][1].get("unseen_test_rows", 0)  # (one split: the same rows at every hook point)
        if unseen:
            log.warning("probe: %d of %d test rows have a class no training row has (%s: %d classes over %d rows): no "
                        "probe can name it, so those rows are wrong whatever the layer; give more items per class, "
                        "or a coarser target", unseen, points[0][1]["test_rows"],
                        "the training items" if b.test_data is not None else "all items", len(np.unique(y)), len(y))
        return {"attrs": {"method": b.method, "metric": "r2" if regression else "accuracy", "pool": b.pool},
                "points": points}

    def test_loader(self) -> Any:
        """test_data's items, batched (hookrun.probe's live set, or the node's): built, and their first
        batch's rows taken, before the run's first batch, so a wrong node or item is one line then."""
        from hookrun.config.build import build_dataset, check_dataset
        from hookrun.runner.loop import make_loader

        node = dict(self.spec.test_data)
        given = node["dataset"] if "dataset" in node else node
        data = check_dataset(LIVE_TEST.get(), "probe.test_data: got") if "live" in given \
            else build_dataset(given, "probe.test_data.dataset")
        if not len(data):
            raise ConfigError("probe.test_data: the data set has no items; give the test items, or drop test_data for the split")
        loader = make_loader(data, node.get("batch_size") or self.ctx.cfg.data.batch_size, 0,  # (by the run's data.collate)
                             collate=c.fn if (c := self.ctx.loader.collate_fn).custom else None)
        indices, batch = next(test_batches(loader))
        check_rows(self.collector.batch(self.ctx.model, self.ctx.spec.split(batch).to(self.ctx.device), indices),
                   self.features, self.y_kind, 1)
        return loader

    def test_pass(self, model: nn.Module, session: Any = None) -> None:
        """test_data's items through the model: the test rows (part 1); the user's hooks modify them, records not (REPLAY)."""
        for indices, batch in test_batches(self.tests):
            self.add(model, self.ctx.spec.split(batch).to(self.ctx.device), indices, part=1, session=session)

    def restore(self, resume: Any, kept: int) -> None:
        """A resumed run: the rows of the `kept` batches, recomputed (the file keeps no rows) through the forward
        `step` had, the user's modifying hooks included (extra_forwards.replay: they were left out, so a resumed run
        with an ablation probed other features than an uninterrupted one)."""
        replay(self, self.begin, kept, self.points, lambda indices, call: self.add(self.ctx.model, call, indices))
        log.info("probe: the rows of the %d kept batch(es) recomputed", kept)

    def close(self) -> None:
        for s in self.stores.values():
            s.close()
        if self.world > 1 and not self.rank and self.link is not None:
            self.link.discard("probe")
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None

    def file_bytes(self, n_samples: int) -> int:
        return probe_bytes(self.features, self.classes, len(json.dumps(self.describe())))

    def plan_lines(self, n_samples: int) -> list[str]:
        return plan(self, n_samples)


def listed_targets(data: Any, n: int | None) -> np.ndarray | None:
    """The class targets of the run's first `n` items (None: all) where the data set lists them up front
    (torchvision's `targets`: a list, array or tensor of integers); None where it does not."""
    t = getattr(data, "targets", None)
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().numpy()
    if not isinstance(t, list | tuple | np.ndarray):
        return None
    t = np.asarray(t[:n] if n is not None else t)
    return t if t.ndim == 1 and t.dtype.kind in "iub" and len(t) else None


def refuse_an_empty_training_split(test: float, n: int) -> None:
    """One line before any batch where the split would hold out every one of the run's `n` items (its
    planned samples): sklearn's train_test_split takes ceil(test * n) test items (fit.py split_items),
    leaving n - that to train."""
    if n == 1:  # (no fraction in (0, 1) leaves a training item: the line below advised 'at most 0.0')
        raise ConfigError(f"probe.split.test={test}: the run has 1 item, and a split needs at least 2 (one to train on, "
                          f"one to test); probe more items, or give probe.test_data")
    if n and math.ceil(test * n) >= n:
        raise ConfigError(f"probe.split.test={test}: the split holds out ceil({test} x {n}) = {math.ceil(test * n)} of "
                          f"the run's {n} items (train_test_split rounds the test items up), leaving none to train on; "
                          f"give probe.split.test at most {math.floor((n - 1) / n * 1e6) / 1e6}, or probe more items")


def test_batches(loader: Any) -> Any:
    """test_data's batches; an item that raises is one line naming probe.test_data (loop.one_line_errors)."""
    from hookrun.runner.loop import one_line_errors

    try:
        yield from one_line_errors(loader)
    except RunError as exc:
        raise RunError("probe.test_data: " + str(exc).removeprefix("data: ")) from exc.__cause__
