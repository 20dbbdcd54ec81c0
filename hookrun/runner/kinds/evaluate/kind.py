"""The evaluate kind: each batch's clean, intervened and (with an ablation) ablated forward, and their metrics.

    kind = EvaluateKind(ctx)                  # prepare(): every check before any batch
    adds = kind.step(model, call, session)    # adds.tables["evaluation"]: the batch's EvaluationRow

| forward    | phase (hookrun.hooks) | hooks                                                  | records |
|------------|-----------------------|--------------------------------------------------------|---------|
| clean      | CLEAN                 | attached, but no action runs                           | none    |
| intervened | INTERVENED            | as configured                                          | all     |
| ablated    | ABLATED               | each modify action returns the ablation (zeros, or the | none    |
|            |                       | mean of an earlier run's rows) instead of its op's     |         |

This folder is the whole kind: its block and refusals (block.py), the ablations (ablations.py), its
table under /evaluation (table.py, written by the store's generic table writer, store/records.py)
and what readers show of it (reader.py); its metrics (metrics.py) take the log-probabilities from
runner/losses.py (log_probs). Spliced modules (ops that append to `env.splices` an object
with `.module` and `.stats`) add their `stats.batch()` per batch and `stats.totals()` for the run;
`stats.reset_batch()` is called before each intervened forward, and where the stats have
`state()` / `load_state(dict)` a resumed run carries them over.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from torch import nn

from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError
from hookrun.hooks import ABLATED, CLEAN, INTERVENED
from hookrun.hooks.actions.modify import Modify
from hookrun.hooks.session import HookSession
from hookrun.output.process import detect, every_rank
from hookrun.runner.calls import ModelCall
from hookrun.runner.extra_forwards import own_copy
from hookrun.runner.kinds import KindContext, RunKind, StepAdds, plain_forward
from hookrun.runner.kinds.evaluate.ablations import (
    MeanAblation,
    read_means,
    warn_non_finite,
    zero_ablation,
)
from hookrun.runner.kinds.evaluate.block import check_block, evaluating
from hookrun.runner.kinds.evaluate.metrics import Objective, Totals, batch_row
from hookrun.runner.kinds.evaluate.table import EvaluationRow, evaluation_bytes, read_evaluation
from hookrun.store.paths import scheme_of

log = logging.getLogger("hookrun")


class EvaluateKind(RunKind):
    mode = Mode.eval
    block = "evaluate"
    forwards = 2  # clean and intervened; 3 with an ablation
    adds = ("evaluation",)
    uses_loss = True  # ce of each forward

    @classmethod
    def wanted(cls, cfg: HookrunConfig) -> bool:
        return evaluating(cfg)

    @classmethod
    def check(cls, cfg: HookrunConfig) -> None:
        check_block(cfg)
        if scheme_of(cfg.output.path).remote:
            raise ConfigError(f"evaluate with output.path={cfg.output.path}: an object-store run has no evaluation "
                              f"datasets yet; write to a local file")
        if detect().many:
            raise every_rank(ConfigError("evaluate with many processes: each rank would hold a part of the totals; "
                                         "run it in one process"))  # (every rank finds it: the CLI prints it on rank 0)

    def __init__(self, ctx: KindContext) -> None:
        super().__init__(ctx)
        ev, env = ctx.cfg.evaluate, ctx.env
        modifying = [(p, a) for p in ctx.points for a in p.actions if a.modifies]
        if ev.ablation is not None:
            if not modifying:
                raise ConfigError(f"evaluate.ablation={ev.ablation}: no hook modifies anything, so there is nothing "
                                  f"to ablate; add a modify action (modify_output, replace_input) or set ablation=null")
            other = next((a for _, a in modifying if not isinstance(a, Modify)), None)
            if other is not None:
                raise ConfigError(f"evaluate.ablation={ev.ablation}: {other.where} modifies with its own code "
                                  f"({type(getattr(other, 'fn', other)).__name__}), which evaluate cannot ablate; "
                                  f"use a modify action with op: {{_target_: ...}} instead")
            if ev.ablation == "mean":
                env.ablation = MeanAblation(read_means(ev.mean, [(p.module, a.hook_type.writable) for p, a in modifying]))
            else:
                env.ablation = zero_ablation
        self.forwards = 3 if ev.ablation is not None else 2
        self.objective = Objective(ctx.loss)
        loss = ctx.loss
        loss_name = "lm" if self.objective.lm else str(getattr(getattr(loss, "func", loss), "__qualname__",
                                                                 type(loss).__name__))
        modules = list(dict.fromkeys(p.module for p, _ in modifying))
        self.attrs = {"ablation": ev.ablation or "none", "modules": modules, "mean": ev.mean or "", "loss": loss_name}
        self.ablation = ev.ablation
        self.env = env
        self.totals = Totals()
        self.warned: set[tuple[str, str]] = set()  # (module, metric) already said to be non-finite

    def step(self, model: nn.Module, call: ModelCall, session: HookSession) -> StepAdds:
        """The batch's forwards (clean, intervened, ablated) and its row of metrics."""
        with session.phase(CLEAN):  # (each forward but the last on its own copy of the inputs: a model may change them in place)
            out = plain_forward(model, own_copy(call))
        clean = self.objective.reference(out, call)
        del out
        for s in self.env.splices:
            s.stats.reset_batch()
        with session.phase(INTERVENED):
            out = plain_forward(model, own_copy(call) if self.ablation is not None else call)
        others = {"intervened": clean.compare(out, call, "intervened")}
        del out
        if self.ablation is not None:
            with session.phase(ABLATED):
                out = plain_forward(model, call)
            others["ablated"] = clean.compare(out, call, "ablated")
            del out
        row = batch_row(clean, others)
        self.totals.add(row)
        splices = self.env.splices
        warn_non_finite(row, "", self.warned)
        for s in splices:
            warn_non_finite(s.stats.batch(), s.module, self.warned)
        state = {s.module: {k: np.asarray(v) for k, v in s.stats.state().items()}
                 for s in splices if callable(getattr(s.stats, "state", None))}
        evaluation = EvaluationRow(row, {s.module: dict(s.stats.batch()) for s in splices},
                                   {"": self.totals.means(), **{s.module: dict(s.stats.totals()) for s in splices}},
                                   state or None, self.attrs)
        return StepAdds(tables={"evaluation": evaluation})

    def file_bytes(self, n_samples: int) -> int:
        """/evaluation: a row per batch of the model's metrics (5, or 9 with an ablation) and of each
        splice's, and the splice statistics' state (l0, mse, ...; sums of d_in and d_sae entries)."""
        batches = -(-n_samples // max(1, self.ctx.loader.batch_size or 1))
        return evaluation_bytes(batches, 9 if self.ablation is not None else 5, [splice_size(s) for s in self.env.splices])

    def sample_step(self, model: nn.Module, call: ModelCall, session: HookSession) -> StepAdds:
        """The estimate sees the intervened forward's captures; the totals are left as they are."""
        plain_forward(model, call)
        return StepAdds()

    def restore(self, resume: Any, kept: int) -> None:
        """A resumed run: the totals of the `kept` batches of the old file, and the splice states
        (a local file: the object-store destination refuses evaluate, output/objects/destination.py)."""
        rows, states = read_evaluation(resume.file, rows=kept)
        for row in rows.values():
            self.totals.add(row.model)
        for s in self.env.splices:
            if s.module in states and callable(getattr(s.stats, "load_state", None)):
                s.stats.load_state(states[s.module])
            elif rows:
                log.warning("resume: the splice at %s cannot carry its statistics over (no state in the file, or "
                            "the stats have no load_state); its run totals cover the batches run from now on", s.module)


def splice_size(splice: Any) -> tuple[int, list[int]]:
    """A splice's metric columns and its statistics' state arrays' bytes (an SAE's: 4 float64
    sums, sum_x of d_in float64, fired of d_sae bools; else the arrays its stats hold now)."""
    coder, stats = getattr(splice, "coder", None), splice.stats
    metrics = len(stats.batch())
    d_in, d_sae = getattr(coder, "d_in", None), getattr(coder, "d_sae", None)
    if isinstance(d_in, int) and isinstance(d_sae, int) and callable(getattr(stats, "state", None)):
        return metrics, [8] * 4 + [8 * d_in, d_sae]
    state = stats.state() if callable(getattr(stats, "state", None)) else {}
    return metrics, [np.asarray(v).nbytes for v in state.values()]
