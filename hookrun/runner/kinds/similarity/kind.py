"""The similarity run kind: one pass over the data with forward hooks at every `at` (and the second
model's `with.at`), the accumulator fed per batch, the matrix written at the end of a complete run.

    python -m hookrun experiment=cka_resnet hydra.run.dir=outputs/cka
    hookrun.open_run("outputs/cka").similarity()     # xarray (at, with_at), the measure per pair

| in the file                          | what                                                        |
|--------------------------------------|-------------------------------------------------------------|
| captures/similarity/__model__/MEASURE | the matrix (at, with_at): rows `at`, columns `with.at` (or `at`) |
| root attribute `similarity` (JSON)   | the block as run, the labels, the route (feature, gram, minibatch), rows |

User hooks (`hooks:`) record in the same forward. The checks and the route (accumulate.choose_route)
come from the first batch's features before the loop, which reuses them for its step 0 where no user
hook needs that forward (one forward of batch 0, not two); a run stopped early writes no matrix (an
object-store run's goes into its last batch's part: PartedStore.write_features, output/objects/parts.py). A
resumed run recomputes the features of the batches it keeps (their forwards, the user's modifying hooks
run again: restore) into the accumulator and goes on, so its matrix equals an uninterrupted run's. Many ranks (torchrun) run
contiguous blocks of the batches; after its pass each rank but 0 saves its accumulator (acc.save) and RankLink.hand_over
(output/rank_link.py) passes it to rank 0, whose RankLink.gather merges them (acc.merge) in batch order
before the matrix is written. Resumed, a rank recomputes its kept batches' features and hands its
accumulator over again, also where its shard was complete (rejoin), while rank 0's shard is not.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from hookrun.config.build import build_model, live_model
from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError, RunError
from hookrun.hooks.actions import ModelHold
from hookrun.hooks.taps import Taps, refuse_non_finite
from hookrun.output.rank_link import RankLink
from hookrun.output.scratch import Scratch, clear_scratch
from hookrun.runner.extra_forwards import first_batch, own_copy, replay
from hookrun.runner.kinds import NOTHING, KindContext, RunKind, StepAdds
from hookrun.runner.kinds.similarity.accumulate import (
    accumulator,
    choose_route,
    pairs_of,
    route_bytes,
)
from hookrun.runner.kinds.similarity.block import LIVE_WITH
from hookrun.runner.kinds.similarity.features import pooled
from hookrun.runner.kinds.similarity.gram import GramRoute
from hookrun.store.overhead import dataset_bytes, table_bytes
from hookrun.store.records import Capture, CaptureKey

HOOK = "similarity"
MIN_ITEMS = 3  # (2 items: every centred Gram matrix has rank 1, and linear CKA is 1 whatever the layers)
UNBIASED_ROWS = 4  # the unbiased HSIC's least rows (it divides by n (n - 3)): a minibatch's, or the whole set's
log = logging.getLogger("hookrun")


class SimilarityKind(RunKind):
    adds = ("captures/similarity",)
    hands_over = True

    @classmethod
    def check_mode(cls, cfg: HookrunConfig) -> None:
        if cfg.mode is not Mode.eval:
            raise ConfigError(f"similarity with mode={cfg.mode.value}: a similarity run makes plain forwards; "
                              f"drop mode or set mode=eval")

    @classmethod
    def check(cls, cfg: HookrunConfig) -> None:
        cls.check_mode(cfg)
        if cfg.similarity.estimator == "minibatch" and cfg.data.batch_size < UNBIASED_ROWS:
            raise ConfigError(f"data.batch_size={cfg.data.batch_size} with similarity.estimator=minibatch: the "
                              f"unbiased HSIC needs batches of at least {UNBIASED_ROWS} rows; raise data.batch_size")

    def __init__(self, ctx: KindContext) -> None:
        super().__init__(ctx)
        self.block = b = ctx.cfg.similarity
        self.undefined: dict[str, str] = {}  # set at the end: series -> why its cells are NaN
        ctx.model.eval()
        self.taps = [Taps(ctx.model, b.at, HOOK, "similarity.at")]
        self.other: nn.Module | None = None
        if b.with_ and "live" in b.with_["model"]:  # hookrun.similarity's live second model, handed back as it came
            ctx.env.hold.on_close(ModelHold(LIVE_WITH.get()).close)
            self.other = live_model(LIVE_WITH.get(), ctx.device)
        elif b.with_:
            self.other = build_model(b.with_["model"], ctx.device, progress=False, where="similarity.with.model")
        if self.other is not None:
            self.taps.append(Taps(self.other, b.with_["at"], HOOK, "similarity.with.at"))
        batch = ctx.cfg.data.batch_size
        self.items = len(ctx.loader.dataset) if hasattr(ctx.loader.dataset, "__len__") else None
        limit = ctx.cfg.data.limit  # (batches): the run sees at most limit * batch rows, sized or not
        seen = self.items if limit is None else limit * batch if self.items is None else min(self.items, limit * batch)
        unbiased = b.estimator == "unbiased"
        least = UNBIASED_ROWS if unbiased else MIN_ITEMS
        if seen is not None and seen < least:
            why = ("the unbiased HSIC divides by n (n - 3)" if unbiased else "with 2, every centred Gram matrix has "
                   "rank 1 and linear CKA is 1 for every pair")
            raise ConfigError(f"similarity over {seen} item(s): CKA and RSA compare how the items lie relative to each "
                              f"other and need at least {least} ({why}); give the run more items")
        indices, call = first_batch(ctx.loader, ctx.spec, size=batch)  # batch 0: features per row, rows
        series = self.features(ctx.model, call.to(ctx.device), indices, first=True)  # every check that needs the models
        self.first: tuple[torch.Tensor, list[torch.Tensor]] | None = (indices, series)  # step 0 reuses them
        self.rows = self.taps[0].names  # (in the order the first forward's outputs came)
        self.cols = self.taps[1].names if self.other is not None else self.rows
        self.dims = [s[0].numel() for s in series]
        if b.estimator == "minibatch" and seen is not None and seen < batch:
            raise ConfigError(f"similarity.estimator=minibatch: the run sees {seen} items, fewer than one "
                              f"batch of data.batch_size={batch}; lower data.batch_size (at least {UNBIASED_ROWS}) or use exact")
        self.route = choose_route(b.measure, b.estimator, self.dims, seen, batch, b.memory)  # sized by the rows run
        self.shape = (len(self.rows), len(self.cols))
        pairs = pairs_of(len(self.rows), len(self.cols) if self.other is not None else None)
        held = b.memory - route_bytes("gram", self.dims, seen, batch, b.measure) if self.route == "gram" else 0
        self.acc = accumulator(self.route, pairs, b.measure, b.sigma, b.dissimilarity, batch, held,  # (rows held, else spooled)
                               unbiased=unbiased)

    def features(self, model: nn.Module, call: Any, items: torch.Tensor, first: bool = False) -> list[torch.Tensor]:
        """One batch through the model (its hooks, and the user's, fire) and the second model (on its own
        copy of the batch's inputs, as they came: the first forward may change them in place): the
        pooled features of every series, each with the batch's rows (`items`: their dataset indices),
        finite (NaN or inf would make every cell of the series NaN, for no reason the run could name).
        The second model's forward failing is one line naming similarity.with.model (`first`: the check
        before any batch, a ConfigError)."""
        out = []
        calls = [call, own_copy(call)] if self.other is not None else [call]  # (before the first model's forward)
        for taps, m, c in zip(self.taps, [model, self.other], calls, strict=False):
            with taps.attached(pooled(self.block.pool, c.attention_mask, taps.where, taps, items)), torch.no_grad():
                if m is self.other:
                    c.run(m, "similarity.with.model: the second model", ConfigError if first else RunError)
                else:
                    c.run(m)
            if first:  # rows and columns in the order the outputs come, as probe's (a block's after its modules)
                taps.follow_forward()
            out += taps.take()
        for k, s in enumerate(out):  # (each of the batch's rows: pooled refuses an output that is not batch first)
            refuse_non_finite(s, items,
                              f"similarity.{'with.' if k >= len(self.taps[0].names) else ''}at: {self.label(k)}",
                              "CKA and RSA need finite features: compare another module")
        return out

    def describe(self) -> dict[str, Any]:
        b = self.block
        return {"measure": b.measure, "estimator": b.estimator, "route": self.route, "pool": b.pool,
                "sigma": b.sigma, "dissimilarity": b.dissimilarity, "memory": b.memory, "rows": self.rows,
                "cols": self.cols, "features": self.dims,
                "with": model_name(b.with_["model"], self.other) if b.with_ else None,
                "model": model_name(self.ctx.cfg.model, self.ctx.model)}

    def prepare_run(self, p: Any) -> None:
        self.begin, self.points = p.batches.start, p.points  # (the session's points: op sites checked)
        self.should_stop = lambda: p.settings.should_stop()
        RankLink.require(self.link, self.world, "similarity", self.rank, self.should_stop)  # (the folder every rank sees)
        clear_scratch(p.cfg.output, "similarity_rows", self.rank)  # a killed run's spool, whatever this run's route
        if isinstance(self.acc, GramRoute):  # (a resume recomputes its kept batches' rows: it needs none of it)
            self.acc.rows.scratch = lambda: Scratch(p.cfg.output, "similarity_rows", self.rank)
        p.attrs["similarity"] = json.dumps(self.describe())

    rank, world, link, begin, points, left = 0, 1, None, 0, [], 0

    def share(self, rank: int, world: int) -> str | None:
        self.rank, self.world = rank, world
        return None

    def join_ranks(self, link: Any) -> None:
        self.link = link

    def step(self, model: nn.Module, call: Any, session: Any) -> StepAdds:
        first, self.first = self.first, None
        indices = self.ctx.env.state.sample_index
        if first is not None and not self.ctx.points and torch.equal(first[0].cpu(), indices.cpu()):
            series = first[1]  # (__init__'s check ran this batch; no user hook needs its forward)
        else:
            series = self.features(model, call, indices)
        dims = [s[0].numel() for s in series]
        if dims != self.dims:  # token rows flattened: the batch's length decides the features
            k = next(i for i, (d, e) in enumerate(zip(dims, self.dims, strict=True)) if d != e)
            raise RunError(f"similarity.pool={self.block.pool}: {self.label(k)} "
                           f"gives {dims[k]} features per item in this batch and {self.dims[k]} in the first; "
                           f"use similarity.pool=mean (rows of varying length)")
        self.acc.add(series)
        return NOTHING

    def label(self, k: int) -> str:
        names = [*self.taps[0].names, *(self.taps[1].names if len(self.taps) > 1 else [])]
        return names[k]

    def sample_step(self, model: nn.Module, call: Any, session: Any) -> StepAdds:
        self.features(model, call, self.ctx.env.state.sample_index)  # the estimate's forward, nothing accumulated
        return NOTHING

    def run_steps(self, data_loop: Any, writer: Any, first_row: int, should_stop: Any) -> int:
        """The data loop, then (a complete pass) the matrix, written once after the last batch."""
        steps = data_loop()
        if should_stop():
            return steps
        if self.world > 1 and not self.merge_ranks(should_stop):
            return steps  # (a rank but 0: its accumulator is rank 0's now)
        writer.drain()  # the writer thread has ended: this thread writes the end of the file
        write = getattr(writer.store, "write_features", None)
        if write is None:
            raise RunError("similarity: this store cannot hold end-of-run arrays; write to a local folder")
        with np.errstate(invalid="ignore", divide="ignore"):  # (0 / 0: a constant series, said once below)
            values = self.acc.matrix(self.shape)
        series = [*self.rows, *(f"with.{n}" for n in self.cols if self.other is not None)]
        constant = [name for name, same in zip(series, self.acc.constant, strict=True) if same]
        each = " within every batch" if self.route == "minibatch" else ""  # (the estimator sees one batch at a time)
        if constant:
            log.warning("similarity: %s give(s) %s: %s is undefined there, NaN in the file (n/a in the pictures)",
                        ", ".join(constant), f"constant features{each}" if each else "the same features for every item",
                        self.block.measure)
        flat = [name for name, f in zip(series, getattr(self.acc, "flat_items", []), strict=False) if f]
        if flat:
            log.warning("similarity: %s: some item's features are all equal there, and its Pearson correlation with "
                        "any item is 0 / 0: rsa with dissimilarity: correlation is undefined, NaN in the file (n/a in "
                        "the pictures); dissimilarity: euclidean is defined for it", ", ".join(flat))
        spread = [name for name, f in zip(series, getattr(self.acc, "no_median", []), strict=False) if f]
        if spread:
            log.warning("similarity: %s: the median squared distance between items is 0 (most items' features are "
                        "equal): the rbf kernel's width sigma x median is 0, rbf_cka is undefined there, NaN in the file "
                        "(n/a in the pictures); linear_cka is defined for it", ", ".join(spread))
        self.left = getattr(self.acc, "left", 0)  # (minibatch: a last, smaller batch's items)
        if self.left:
            log.warning("similarity: the minibatch estimator takes full batches of %d items: the last batch's %d are "
                        "left out of the matrix (a data.batch_size that divides the items takes them all)", self.acc.batch, self.left)
        self.undefined = {**{n: f"constant features{each}" for n in constant}, **{n: "an item's features all equal" for n in flat},
                          **{n: "median distance 0" for n in spread}}
        matrix = torch.from_numpy(values)
        key = CaptureKey(HOOK, "", HOOK, self.block.measure)
        write([Capture(key, matrix, False, features=True, dims=("at", "with_at"))])  # labels: root attribute
        return steps

    def end_attrs(self) -> dict[str, Any]:
        """The `similarity` attribute again, with why any cell is NaN (readers title the picture with it) and the
        items the minibatch estimator left out (`left_out`: the notes say the matrix is not over every item)."""
        if not self.undefined and not self.left:
            return {}
        return {"similarity": json.dumps({**self.describe(), "undefined": self.undefined, "left_out": self.left})}

    def merge_ranks(self, should_stop: Any) -> bool:
        """Ranks 1..N-1 hand their accumulator to rank 0 (False); rank 0 merges every rank's in rank order."""
        if self.rank:
            self.link.hand_over("similarity", self.acc.save, should_stop)
            return False
        self.link.gather("similarity", self.acc.merge, should_stop)
        return True

    def rejoin(self, resume: Any, kept: int) -> None:
        """A rank but 0 whose shard was complete, resumed: its accumulator rebuilt from its batches and handed
        to rank 0 again, where rank 0 still gathers."""
        self.link.rejoin("similarity", lambda: self.restore(resume, kept), self.acc.save, self.should_stop)

    def restore(self, resume: Any, kept: int) -> None:
        """A resumed run: the features of the `kept` batches, recomputed into the accumulator (the file keeps none),
        through the forward `step` had: the user's hooks attached, each batch's step and items set, and their
        modifying actions run (REPLAY); records and top_examples do not run again (the file keeps theirs)."""
        replay(self, self.begin, kept, self.points, lambda indices, call: self.acc.add(self.features(self.ctx.model, call, indices)))
        log.info("similarity: the features of the %d kept batch(es) recomputed", kept)

    def close(self) -> None:
        close = getattr(getattr(self, "acc", None), "close", None)
        if close is not None:
            close()
        if self.world > 1 and not self.rank and self.link is not None:
            self.link.discard("similarity")

    def plan_lines(self, n_samples: int) -> list[str]:
        """dry_run: the measure, the route and what it holds at its peak (similarity.memory), each series' features."""
        from hookrun.analysis.stats import human_bytes  # (the printout only)

        b, batch = self.block, self.ctx.cfg.data.batch_size
        peak = route_bytes(self.route, self.dims, n_samples, batch, b.measure, b.estimator == "unbiased")
        n = len(self.rows)
        series = ", ".join(f"{self.label(k)} {d}" for k, d in enumerate(self.dims[:n]))
        series += f"; with.at: {', '.join(f'{self.label(k)} {d}' for k, d in enumerate(self.dims) if k >= n)}" if self.other else ""
        return [f"  similarity {b.measure}, estimator {b.estimator} ({self.route} route), pool {b.pool}: a {self.shape[0]} x "
                f"{self.shape[1]} matrix over {n_samples} items; holds about {human_bytes(peak)} of similarity.memory "
                f"{human_bytes(b.memory)}; features at: {series}"]

    def file_bytes(self, n_samples: int) -> int:
        """The matrix (float64, a capture of its step: its header and chunk index) under its three groups
        (captures/similarity/NAME), and the root's `similarity` attribute (written again where a cell is NaN)."""
        return 8 * len(self.rows) * len(self.cols) + dataset_bytes([(3, 1, True)]) + \
            table_bytes(3, 0, 2, 4 * len(json.dumps(self.describe())))


GENERIC = {"hookrun.models.hf": "model_class", "hookrun.models.timm_model": "name"}  # builders of many models


def model_name(node: Any, model: nn.Module) -> str:
    """The model's `_target_` (torchvision.models.resnet18), or its class where it was given live; for
    hookrun's builders of many models, what they built (LlamaForCausalLM, timm's model name)."""
    get = node.get if isinstance(node, Mapping) else lambda k, d=None: getattr(node, k, d)
    target = get("_target_")
    if target in GENERIC:
        return str(get(GENERIC[target]) or type(model).__name__)
    return str(target or type(model).__name__)
