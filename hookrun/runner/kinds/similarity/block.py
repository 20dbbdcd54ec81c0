"""The `similarity:` block: its keys, types and defaults, and the checks that need no model.

    similarity: {at: [layer1, layer2], measure: linear_cka, pool: mean}
    similarity: {at: [layer1], with: {model: {_target_: torchvision.models.resnet34}, at: [layer1]}}

Parsed once (hookrun.config.plugins.parse_block, from hookrun.config.load) before the model is
built: an unknown key, a wrong type, an unknown measure and the pairs that do not go together are one
ConfigError line each.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from hookrun.config import SWEPT
from hookrun.errors import ConfigError, close_matches, one_of, parse_bytes

MEASURES = ("linear_cka", "rbf_cka", "rsa")
ESTIMATORS = ("exact", "unbiased", "minibatch")
POOLS = ("flatten", "mean")
DISSIMILARITIES = ("correlation", "euclidean")
# the defaults of the keys one measure reads (None in the block: not given, so one given to another measure is refused)
SIGMA, DISSIMILARITY = 0.8, "correlation"
USED_BY = {"sigma": ("rbf_cka", "the rbf kernel's width"), "dissimilarity": ("rsa", "RSA's dissimilarity between items")}
# sigma's range: wider, exp(-d^2 / (2 sigma^2 median)) is 0 off the diagonal (1e-3: exp(-5e5)) or 1 - ~1e-7 d^2 / median
# everywhere (1e3: its centred kernel keeps 9 of float64's 16 digits); inf made every cell 0, 1e200 overflowed
SIGMAS = (1e-3, 1e3)
log = logging.getLogger("hookrun")
WITH_KEYS = ("model", "at")
# hookrun.similarity(..., with_={"model": module}): the live second model, handed to the kind for one run
# (notebook.py sets it; the block's node says {live: package.Class}, as run(cfg, model=m)'s `model` does)
LIVE_WITH: ContextVar[Any] = ContextVar("similarity_live_with", default=None)


@dataclass
class SimilarityBlock:
    """What a similarity run was asked for; `check()` normalises `at`, `with` and `memory` (bytes)."""

    at: Any = field(default_factory=list)  # module paths or globs of the run's model (a string: one)
    with_: Any = None  # {model: {_target_: ...}, at: [...]}: a second model on the same batches
    measure: str = "linear_cka"
    sigma: float | None = None  # rbf_cka only: the width, a fraction of the median distance between rows (SIGMA)
    dissimilarity: str | None = None  # rsa only: 1 - Pearson correlation (DISSIMILARITY), or euclidean
    estimator: str = "exact"  # exact (Kornblith et al.) | unbiased (Song et al.'s HSIC, all rows) | minibatch
    pool: str = "flatten"  # flatten | mean over space / tokens (padding never enters)
    memory: Any = "2GB"  # bytes the accumulators may hold

    def check(self) -> None:
        self.measure = _choice(self.measure, MEASURES, "measure")
        self.estimator = _choice(self.estimator, ESTIMATORS, "estimator")
        self.pool = _choice(self.pool, POOLS, "pool")
        for key, (measure, what) in USED_BY.items():  # (ignored, it would read as part of the run)
            if getattr(self, key) is not None and self.measure != measure:
                if "similarity.measure" in os.environ.get(SWEPT, "").split():  # (its jobs of that measure read it)
                    log.info("similarity.%s=%r: %s, read by measure=%s only: not by this job's measure=%s (a sweep "
                             "over similarity.measure)", key, getattr(self, key), what, measure, self.measure)
                    setattr(self, key, None)
                    continue
                raise ConfigError(f"similarity.{key}={getattr(self, key)!r}: {what}, read by measure={measure} only, not "
                                  f"by measure={self.measure}; remove {key}, or set measure: {measure} (a -m sweep over "
                                  f"similarity.measure gives it to its {measure} jobs)")
        self.sigma = SIGMA if self.sigma is None else self.sigma
        self.dissimilarity = _choice(DISSIMILARITY if self.dissimilarity is None else self.dissimilarity,
                                     DISSIMILARITIES, "dissimilarity")
        self.at = _names(self.at, "similarity.at")
        if self.estimator == "minibatch" and self.measure != "linear_cka":
            why = ("the rbf kernel's width is the median distance over all rows, which a batch does not have"
                   if self.measure == "rbf_cka" else "RSA ranks the dissimilarities of all rows at once")
            raise ConfigError(f"similarity.estimator=minibatch with measure={self.measure}: undefined ({why}); "
                              f"use estimator: exact, or measure: linear_cka")
        if self.estimator == "unbiased" and self.measure == "rsa":
            raise ConfigError("similarity.estimator=unbiased with measure=rsa: undefined (the unbiased estimator is "
                              "of HSIC, and RSA is a rank correlation); use estimator: exact, or measure: linear_cka")
        number = isinstance(self.sigma, int | float) and not isinstance(self.sigma, bool)
        if not number or not SIGMAS[0] <= self.sigma <= SIGMAS[1]:  # (NaN and inf fail too)
            raise ConfigError(f"similarity.sigma={self.sigma!r}: the rbf width is a fraction of the median distance "
                              f"between rows, from {SIGMAS[0]:g} to {SIGMAS[1]:g} (Kornblith et al. use 0.2 to 0.8)")
        self.memory = parse_bytes(self.memory, "similarity.memory")
        if self.with_ is not None:
            self.with_ = _with(self.with_)

    @property
    def columns(self) -> list[str]:
        """The matrix's columns: the second model's `with.at`, or `at` itself."""
        return self.with_["at"] if self.with_ else self.at


def _choice(value: Any, choices: tuple[str, ...], key: str) -> str:
    if value in choices:
        return str(value)
    hint = close_matches(str(value), choices, n=1)
    raise ConfigError(f"similarity.{key}={value!r}: not {'an' if key[0] in 'aeiou' else 'a'} {key}{f'; did you mean {hint[0]}?' if hint else ''} "
                      f"(choose one of: {one_of(choices)})")


def _names(value: Any, where: str) -> list[str]:
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, list | tuple) else None
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{where}={value!r}: give one or more module paths or globs, e.g. [layer1, layer2]")
    return names


def _with(node: Any) -> dict[str, Any]:
    if not isinstance(node, Mapping):
        raise ConfigError(f"similarity.with={node!r}: give {{model: {{_target_: ...}}, at: [...]}}")
    unknown = [k for k in node if k not in WITH_KEYS]
    if unknown:
        why = " (the second model runs on the run's own batches)" if unknown[0] in ("data", "batch_size") else ""
        hint = close_matches(str(unknown[0]), WITH_KEYS, n=1) if not why else []
        raise ConfigError(f"similarity.with.{unknown[0]}: not a key of with{why}; "
                          f"{f'did you mean similarity.with.{hint[0]}? (it has: model, at)' if hint else 'it has: model, at'}")
    model = node.get("model")
    if isinstance(model, Mapping) and "live" in model and LIVE_WITH.get() is None:
        raise ConfigError(f"similarity.with.model={dict(model)!r} names a live model, which only "
                          f"hookrun.similarity(model, data, with_={{'model': module, 'at': [...]}}) hands over; in a "
                          f"config give {{_target_: package.module.Name}}")
    if not isinstance(model, Mapping) or not (model.get("_target_") or "live" in model):
        raise ConfigError(f"similarity.with.model={model!r}: give the second model as a node with "
                          f"`_target_: package.module.Name`, e.g. {{_target_: torchvision.models.resnet34}}")
    return {"model": dict(model), "at": _names(node.get("at"), "similarity.with.at")}
