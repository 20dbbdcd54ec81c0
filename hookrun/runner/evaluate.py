"""evaluate: each batch's clean, intervened and (with an ablation) ablated forward, and their metrics.

    evaluator = build_evaluator(cfg, loss, points, env)   # prepare(): every check before any batch
    row = evaluator.step(model, call, session)            # the loop, per batch -> StepRecord.evaluation

| forward    | hooks                                                        | records |
|------------|--------------------------------------------------------------|---------|
| clean      | attached, but no action runs (HookSession.phase(CLEAN))      | none    |
| intervened | as configured                                                 | all     |
| ablated    | each modify action returns the ablation (zeros, or the mean   | none    |
|            | of an earlier run's rows) instead of its op's result          |         |

The metrics' formulas are in runner/metrics.py; the rows go to /evaluation (store/evaluation.py).
Spliced modules (ops that append to `env.splices` an object with `.module` and `.stats`) add their
`stats.batch()` per batch and `stats.totals()` for the run; `stats.reset_batch()` is called before
each intervened forward, and where the stats have `state()` / `load_state(dict)` a resumed run
carries them over.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch import nn

from hookrun.config.schema import HookrunConfig
from hookrun.errors import ConfigError, HookrunError, RunError, one_of
from hookrun.hooks.actions import ActionEnv
from hookrun.hooks.actions.modify import Modify
from hookrun.hooks.events import ABLATED, CLEAN, INTERVENED, family
from hookrun.hooks.points import HookPoint
from hookrun.runner.calls import ModelCall
from hookrun.runner.metrics import Objective, Totals, batch_row
from hookrun.runner.ranks import detect
from hookrun.store.evaluation import read_evaluation
from hookrun.store.records import EvaluationRow
from hookrun.store.remote import is_url
from hookrun.store.schema import RowKind, damage, list_captures

log = logging.getLogger("hookrun")
ABLATIONS = ("zero", "mean")


class Evaluator:
    def __init__(self, objective: Objective, env: ActionEnv, attrs: dict, ablation: str | None) -> None:
        self.objective = objective
        self.env = env
        self.attrs = attrs
        self.ablation = ablation
        self.totals = Totals()

    def step(self, model: nn.Module, call: ModelCall, session: Any) -> EvaluationRow:
        """The batch's forwards (clean, intervened, ablated) and its row of metrics."""
        with session.phase(CLEAN):
            out = forward(model, call)
        clean = self.objective.reference(out, call)
        del out
        for s in self.env.splices:
            s.stats.reset_batch()
        with session.phase(INTERVENED):
            out = forward(model, call)
        others = {"intervened": clean.compare(out, call, "intervened")}
        del out
        if self.ablation is not None:
            with session.phase(ABLATED):
                out = forward(model, call)
            others["ablated"] = clean.compare(out, call, "ablated")
            del out
        row = batch_row(clean, others)
        self.totals.add(row)
        splices = self.env.splices
        state = {s.module: {k: np.asarray(v) for k, v in s.stats.state().items()}
                 for s in splices if callable(getattr(s.stats, "state", None))}
        return EvaluationRow(row, {s.module: dict(s.stats.batch()) for s in splices},
                             {"": self.totals.means(), **{s.module: dict(s.stats.totals()) for s in splices}},
                             state or None, self.attrs)

    def restore(self, old: h5py.File, kept: int) -> None:
        """A resumed run: the totals of the `kept` batches of the old file, and the splice states."""
        rows, states = read_evaluation(old, rows=kept)
        for row in rows.values():
            self.totals.add(row.model)
        for s in self.env.splices:
            if s.module in states and callable(getattr(s.stats, "load_state", None)):
                s.stats.load_state(states[s.module])
            elif rows:
                log.warning("resume: the splice at %s cannot carry its statistics over (no state in the file, or "
                            "the stats have no load_state); its run totals cover the batches run from now on", s.module)


def forward(model: nn.Module, call: ModelCall) -> Any:
    with torch.no_grad():
        return call.run(model)


def build_evaluator(cfg: HookrunConfig, loss: Any, points: list[HookPoint], env: ActionEnv) -> Evaluator | None:
    """The run's Evaluator (None without evaluate), after every check that can run before a batch."""
    ev = cfg.evaluate
    if ev is None or not ev.enabled:
        return None
    if cfg.mode.value != "eval":
        raise ConfigError(f"evaluate needs mode=eval (its forwards run under no_grad), got mode={cfg.mode.value}; "
                          f"drop evaluate or set mode=eval")
    if cfg.early_stop:
        raise ConfigError("evaluate with early_stop=true: the clean forward needs the whole model (its output); "
                          "drop early_stop or evaluate")
    if loss is None:
        raise ConfigError("evaluate has no loss for ce: add loss=lm (a language model's next-token cross-entropy), "
                          "loss=cross_entropy (a classifier) or loss=custom")
    if is_url(cfg.output.path):
        raise ConfigError(f"evaluate with output.path={cfg.output.path}: an object-store run has no evaluation "
                          f"datasets yet; write to a local file")
    if detect().many:
        raise ConfigError("evaluate with many processes: each rank would hold a part of the totals; run it in one process")
    if ev.ablation is not None and ev.ablation not in ABLATIONS:
        raise ConfigError(f"evaluate.ablation={ev.ablation!r}; choose {one_of(ABLATIONS)} or null (no ablated forward)")
    if ev.mean is not None and ev.ablation != "mean":
        raise ConfigError(f"evaluate.mean={ev.mean!r} is read by evaluate.ablation=mean only (ablation is "
                          f"{ev.ablation}); set evaluate.ablation=mean or drop evaluate.mean")
    modifying = [(p, a) for p in points for a in p.actions if a.modifies]
    if ev.ablation is not None:
        if not modifying:
            raise ConfigError(f"evaluate.ablation={ev.ablation}: no hook modifies anything, so there is nothing to "
                              f"ablate; add a modify action (modify_output, replace_input) or set ablation=null")
        other = next((a for _, a in modifying if not isinstance(a, Modify)), None)
        if other is not None:
            raise ConfigError(f"evaluate.ablation={ev.ablation}: {other.where} modifies with its own code "
                              f"({type(getattr(other, 'fn', other)).__name__}), which evaluate cannot ablate; "
                              f"use a modify action with op: {{_target_: ...}} instead")
        if ev.ablation == "mean":
            if not ev.mean:
                raise ConfigError("evaluate.ablation=mean without a mean to use: set evaluate.mean=RUN.h5, an earlier "
                                  "hookrun run that recorded each modified module's output (rows: token gives the "
                                  "per-token mean)")
            env.ablation = MeanAblation(read_means(ev.mean, [(p.module, a.hook_type.writable) for p, a in modifying]))
        else:
            env.ablation = zero_ablation
    modules = list(dict.fromkeys(p.module for p, _ in modifying))
    objective = Objective(loss)
    loss_name = "lm" if objective.lm else str(getattr(getattr(loss, "func", loss), "__qualname__", type(loss).__name__))
    attrs = {"ablation": ev.ablation or "none", "modules": modules, "mean": ev.mean or "", "loss": loss_name}
    return Evaluator(objective, env, attrs, ev.ablation)


def zero_ablation(x: torch.Tensor, module: str, role: str) -> torch.Tensor:
    return torch.zeros_like(x)


class MeanAblation:
    """ablation=mean: each modified tensor replaced by the mean of an earlier run's rows of it."""

    def __init__(self, means: dict[tuple[str, str], np.ndarray]) -> None:
        self.means = means
        self._on: dict[tuple, torch.Tensor] = {}  # (module, role, dtype, device) -> the mean there

    def __call__(self, x: torch.Tensor, module: str, role: str) -> torch.Tensor:
        key = (module, role, x.dtype, x.device)
        mean = self._on.get(key)
        if mean is None:
            if (module, role) not in self.means:
                have = ", ".join(sorted(f"{m or '(model)'} {r}" for m, r in self.means))
                raise RunError(f"evaluate.mean: the file has no capture of {module or '(model)'} {role}; it has {have}")
            mean = self._on[key] = torch.as_tensor(self.means[(module, role)]).to(x.device, x.dtype)
        try:
            return mean.expand_as(x).clone()
        except RuntimeError:
            raise RunError(f"evaluate.mean: the mean of {module or '(model)'} {role} has shape {tuple(mean.shape)}, which "
                           f"does not fit the tensor's {tuple(x.shape)}; record it with rows: token (one row per "
                           f"token) or with the same shape") from None


def read_means(path: str, wanted: list[tuple[str, str]]) -> dict[tuple[str, str], np.ndarray]:
    """The mean row of each capture of `path` whose module and role family (output, input) a modify
    action replaces: float64, read block by block."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"evaluate.mean: no file {str(file)!r} (an earlier hookrun run that recorded the modified "
                          f"modules' outputs)")
    try:
        f = h5py.File(file, "r", locking=False)
    except OSError as exc:
        raise ConfigError(f"evaluate.mean: {str(file)!r} is not a readable HDF5 file ({exc})") from None
    with f:
        try:
            captures = list_captures(f)
        except HookrunError as exc:  # a damaged object header, named
            raise ConfigError(f"evaluate.mean: {str(file)!r}: {exc}; record the means again (or point evaluate.mean at an intact copy)") from None
        out = {}
        for module, fam in dict.fromkeys(wanted):
            found = [c for c in captures if c.module == module and family(c.role) == fam]
            usable = [c for c in found if c.rows in (RowKind.SAMPLES.value, RowKind.TOKENS.value) and len(c.shape) >= 2]
            if not usable:
                have = ", ".join(sorted({f"{c.module or '(model)'} {c.role}" for c in captures})) or "no captures"
                raise ConfigError(f"evaluate.mean: {str(file)!r} has no {'usable ' if found else ''}capture of "
                                  f"{module or '(model)'} {fam} (it has {have}); record it there with "
                                  f"{{name: record, what: {fam}, rows: token}}")
            for c in usable:
                try:
                    out[(module, c.role)] = _mean(f[c.path])
                except (KeyError, OSError, RuntimeError, ValueError) as exc:  # a damaged chunk
                    raise ConfigError(f"evaluate.mean: {str(file)!r}: the capture {c.path} cannot be read: the file is "
                                      f"damaged ({damage(exc)}); record the means again (or point evaluate.mean at an intact copy)") from None
    return out


def _mean(ds: h5py.Dataset, block: int = 4096) -> np.ndarray:
    total = np.zeros(ds.shape[1:], dtype=np.float64)
    for start in range(0, ds.shape[0], block):
        total += ds[start : start + block].astype(np.float64).sum(axis=0)
    if not ds.shape[0]:
        raise ConfigError(f"evaluate.mean: {ds.file.filename}: {ds.name} has no rows")
    return total / ds.shape[0]
