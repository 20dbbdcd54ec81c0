"""Ops that steer or ablate along a linear probe's direction, read from an earlier probe run's file:
the probe kind's `ops` (its KIND in __init__.py), found by name when an action first says `op:`.

    actions: [{name: modify_output, op: probe_steer, probe: outputs/probe_shapes, label: 2, factor: 3.0}]
    actions: [{name: modify_output, op: probe_ablate, probe: outputs/probe_shapes}]

`probe` is the probe run (a file, a run folder, a merged view of ranks or an object-store URL, as for
`patch`); `at` picks its hook point (default: the hooked module). The weights are the file's
`/probe/NNN/weight` on the pooled activations, standardisation folded in (table.py, whose lookup this reads),
so each row is a direction in the module's feature space:
- `probe_steer` adds `factor` times the unit direction of `label`'s class (its weight row; for a
  binary probe the one row, negated for the first class; a ridge probe's one row with no label)
  along the feature axis, at every position: x + factor * w / |w|.
- `probe_ablate` removes the span of the probe's weight rows from the features at every position:
  x - Q Q^T x with Q an orthonormal basis of that span (float64). A probe of 2+ rows' rows are
  centred first (they sum to zero: a 4-class probe reads 3 directions), and singular values under
  RANK_RTOL of the largest are rounding; the log names how many directions it removes. For `pool: mean` (linear) the
  pooled features then score the bias alone: the probe can no longer read its target.

The feature axis is the one the probe kind reads as features (feature_axis): dim 1 of a flat row or of a
feature map (the last of a channels-last map, points.last_roles), the last of token rows (B, T, D), a
torch *1d module's channels; never chosen by the sizes, so token rows of as many tokens as features
are steered along their features. `dim:` overrides it. Every check of the
file (a probe run, fitted on this run's model: its model_fingerprint, the hook point, the label) runs
when the plan is built, before any batch; a
module whose features differ from the probe's is refused, naming both, on one sample's forward before any batch.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from hookrun.errors import ConfigError, HookrunError, NotFoundError, RunError, module_label
from hookrun.hooks.ops import OpBuild, OpContext
from hookrun.hooks.plan import last_roles
from hookrun.runner.kinds.probe import table
from hookrun.store.reading import open_source

log = logging.getLogger("hookrun")
# a direction whose singular value is below this fraction of the largest is rounding, not a direction
# (a fit's real directions are far above it; float64 rounding is about 1e-13 of the largest)
RANK_RTOL = 1e-8


def probe_steer(probe: str, label: Any = None, factor: float = 1.0, at: str | None = None, dim: int | None = None,
                any_model: bool = False, *, build: OpBuild):
    weight, classes, module = read_probe(probe, at, build, any_model)
    where = f"{build.where}: probe_steer {probe!r} at {module_label(module)}"
    direction = steer_direction(weight, classes, label, where)
    norm = float(np.linalg.norm(direction))
    if not norm > 0 or not np.isfinite(norm):  # a constant target's ridge probe: x / 0 would steer every value to NaN
        which = "its weight row" if label is None else f"the weight row of label {label!r}"
        raise ConfigError(f"{where}: {which} is {'all zeros' if norm == 0 else 'not finite'}, so it has no direction "
                          f"to steer along (the probe read nothing of its target: a constant target?); probe a target "
                          f"that varies{'' if label is None else ', or steer with another label'}")
    return AlongFeatures(direction * (factor / norm), dim, where, steer=True, build=build)


def probe_ablate(probe: str, at: str | None = None, dim: int | None = None, any_model: bool = False, *, build: OpBuild):
    weight, classes, module = read_probe(probe, at, build, any_model)
    where = f"{build.where}: probe_ablate {probe!r} at {module_label(module)}"
    basis = ablate_basis(weight, classes)
    log.info("%s: removes %d direction(s) (the span of its %d weight row(s))", where, basis.shape[1], len(weight))
    return AlongFeatures(basis, dim, where, steer=False, build=build)


def ablate_basis(weight: np.ndarray, classes: list | None) -> np.ndarray:
    """An orthonormal basis (features, k) of the directions the probe reads. The rows of a probe of 2+
    rows (multinomial logistic, one-hot ridge) are centred first: its scores compare the rows (softmax,
    argmax), and its fit makes them sum to zero, so they span classes - 1 directions (numerically one
    more, of the size of the solver's rounding). Singular values below RANK_RTOL x the largest are 0."""
    rows = weight - weight.mean(0) if classes and len(weight) > 1 else weight
    u, s, _ = np.linalg.svd(rows.T, full_matrices=False)  # (features, rows): the span of the rows
    return u[:, s > s.max() * RANK_RTOL] if s.size and s.max() > 0 else u[:, :0]


def read_probe(source: str, at: str | None, build: OpBuild, any_model: bool = False) -> tuple[np.ndarray, list | None, str]:
    """(weight (rows, features) float64, the classes or None for a regression, the probed module);
    `any_model`: a probe of other weights is taken (a transfer the user means: a fine-tuned model, another dtype)."""
    if not isinstance(source, str) or not source:
        raise ConfigError(f"{build.where}: give probe: PATH of a probe run's file or folder, got {source!r}")
    module = build.point.module if at is None else str(at)
    where = f"{build.where}: probe {source!r}"
    try:
        run = open_source(source)
    except NotFoundError as exc:
        raise ConfigError(f"{where}: {exc} (run the probe first, or fix the path)") from None
    except HookrunError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    try:
        if any_model is not True:
            check_same_model(run.file.attrs, build, where)
        groups = table.point_groups(run.file)
        if not groups:
            raise ConfigError(f"{where} holds no probes (a probe run writes /probe at its last batch); give the "
                              f"file of a complete probe run")
        g = table.point_group(run.file, module)
        if g is None:
            probed = ", ".join(str(p.attrs["module"]) for p in groups)
            raise ConfigError(f"{where} has no probe at {module!r}; it probed {probed} (set at: to one of them)")
        return np.asarray(g["weight"][:], dtype=np.float64), table.classes(g), module
    finally:
        run.close()


def check_same_model(attrs: Any, build: OpBuild, where: str) -> None:
    """The probe was fitted on this run's model (the file's model_fingerprint against the weights' digest,
    computed once per run): a direction in another network's feature space, of the same width, steers
    nothing it names. One ConfigError line naming both models, before any batch."""
    from hookrun.config.build import same_weights, weights_digest

    theirs, model = str(attrs.get("model_fingerprint") or ""), getattr(build.env, "model", None)
    if not theirs or model is None:
        return
    shared = build.env.shared
    mine = shared["weights_digest"] if "weights_digest" in shared else shared.setdefault("weights_digest", weights_digest(model))
    if not mine or same_weights(theirs, mine):
        return
    ours = f"{type(model).__module__}.{type(model).__qualname__}"
    raise ConfigError(f"{where} was fitted on another model ({attrs.get('model_class', '?')}, weights {theirs[:8]}) "
                      f"than this run's ({ours}, weights {mine[:8]}): its directions are in that model's features; "
                      f"steer the model the probe read (its model, weights and seed), fit a probe on this model, or give "
                      f"any_model: true to use it here on purpose (a fine-tuned or recast copy)")


def steer_direction(weight: np.ndarray, classes: list | None, label: Any, where: str) -> np.ndarray:
    """The weight row that raises `label`'s score (a binary probe's one row points to classes[1])."""
    if not classes:  # ridge regression: one row, no class
        if label is not None:
            raise ConfigError(f"{where}: the probe is a regression (one output); leave label out")
        return weight[0]
    if label is None:
        raise ConfigError(f"{where}: give label: the class to steer towards, one of {classes}")
    hits = [i for i, c in enumerate(classes) if c == label or str(c) == str(label)]
    if not hits:
        raise ConfigError(f"{where}: label {label!r} is not one of the probe's classes {classes}")
    if weight.shape[0] == 1:  # binary: scores > 0 mean classes[1]
        return weight[0] if hits[0] == 1 else -weight[0]
    return weight[hits[0]]


def feature_axis(x: torch.Tensor, module: Any, model: Any, family: str) -> tuple[int, str]:
    """The axis of `x` (a module's output, or input) that a probe of the module reads as its features, and
    its name: the probe kind's layout (pool.py, hooks/taps.py), never decided by the sizes (token rows of as
    many tokens as features, a map as wide as its channels). (B, D): 1. (B, T, D): token rows, the last;
    a torch *1d module's (Conv1d, BatchNorm1d, ...) (B, C, L), its channels. A 4-D map: its channels, dim 1,
    or the last where the module's output (or input) is channels-last as the hooks read it (points.last_roles:
    Swin, a Linear or LayerNorm over a 4-D tensor; an input where the module keeps that layout)."""
    kind = type(module).__name__
    if x.dim() == 3:
        return (1, "dim 1, a 1-d map's channels") if kind.endswith("1d") else (2, "the last axis of token rows")
    if x.dim() == 4 and isinstance(module, nn.Module):
        if family in last_roles(module, model if isinstance(model, nn.Module) else module):
            return 3, "the last axis of a channels-last map"
    return 1, "dim 1, the channels" if x.dim() > 2 else "dim 1"


class AlongFeatures:
    """The op: add `vectors` (features,) or project out `vectors`' columns (features, k) along the
    module's feature axis."""

    def __init__(self, vectors: np.ndarray, dim: int | None, where: str, steer: bool, build: OpBuild) -> None:
        self.vectors, self.dim, self.where, self.steer = vectors, dim, where, steer
        self.model, self.family = getattr(build.env, "model", None), build.family
        self.features = vectors.shape[0]
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
            raise ConfigError(f"{where}: dim {dim!r}; give the feature axis as a whole number (1, or -1 for token rows)")

    def axis(self, x: torch.Tensor, module: Any) -> int:
        if self.dim is not None:
            axis = self.dim % max(x.dim(), 1)
            if x.dim() < 2 or axis == 0 or x.shape[axis] != self.features:
                raise RunError(f"{self.where}: dim {self.dim} of the output {tuple(x.shape)} is not the probe's "
                               f"{self.features} features")
            return axis
        axis, what = feature_axis(x, module, self.model, self.family)
        if x.dim() < 2 or x.shape[axis] != self.features:
            raise RunError(f"{self.where}: the output {tuple(x.shape)} has no axis of the probe's {self.features} "
                           f"features where a probe reads them ({what}: {x.shape[axis] if x.dim() >= 2 else 'none'}); "
                           f"steer the module the probe read, or set dim: to the features' axis")
        return axis

    def check_tensor(self, x: torch.Tensor, module: Any) -> None:
        """axis()'s check on one sample's forward, before any batch (Modify.check_tensor): one ConfigError line."""
        try:
            self.axis(x, module)
        except RunError as exc:
            raise ConfigError(str(exc)) from None

    def __call__(self, x: torch.Tensor, ctx: OpContext) -> torch.Tensor:
        axis = self.axis(x, ctx.target)
        moved = x.movedim(axis, -1)
        if self.steer:
            v = torch.as_tensor(self.vectors, dtype=x.dtype, device=x.device)
            return (moved + v).movedim(-1, axis)
        q = torch.as_tensor(self.vectors, dtype=torch.float64, device=x.device)
        wide = moved.to(torch.float64)
        return (wide - (wide @ q) @ q.T).to(x.dtype).movedim(-1, axis)
