"""evaluate's ablations: what a modify action returns in the ablated forward (the evaluate kind's third).

    env.ablation = zero_ablation                     # evaluate.ablation=zero
    env.ablation = MeanAblation(read_means("clean.h5", [("layer1", "output")]))   # ablation=mean

Each is called as `ablation(x, module, role)` by a modify action (hooks/actions/modify.py) in the
ABLATED phase and returns the tensor that replaces `x`. The evaluate kind itself, its forwards and
its checks are hookrun.runner.kinds.evaluate.kind.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import h5py
import numpy as np
import torch

from hookrun.errors import ConfigError, HookrunError, NotFoundError, RunError, module_label
from hookrun.hooks import family
from hookrun.store import RowKind
from hookrun.store.listing import damage, list_captures
from hookrun.store.reading import open_source

log = logging.getLogger("hookrun")
CAUSES = {
    "ce_clean": "the model's own logits are not finite (before any hook)",
    "intervened": "the hooked forward's logits are not finite: an op or a splice put NaN/inf into the model",
    "ablated": "the ablated forward's logits are not finite (ablation=mean: NaN/inf in the mean file?)",
    "_score": "its denominator (ce_ablated - ce_clean, or the clean ce) is 0 or not finite",
    "explained_variance": "the SAE's reconstruction is not finite, or the activations it reads do not vary (variance 0)",
    "mse": "the SAE's reconstruction is not finite (NaN/inf in its output), or the activations it reads are not",
}


def warn_non_finite(values: dict, module: str, seen: set) -> None:
    """One warning per (module, metric) whose value came out NaN or inf, with its likely cause
    (l0 and dead_fraction of a module without latents are NaN by definition: not warned)."""
    for name, value in values.items():
        if name in ("l0", "dead_fraction") or (module, name) in seen or not isinstance(value, float) or math.isfinite(value):
            continue
        seen.add((module, name))
        cause = next((c for key, c in CAUSES.items() if key in name), "a NaN or inf in the forward")
        log.warning("evaluate: %s%s is %s from this batch on (the run's totals too): %s", name,
                    f" of the splice at {module}" if module else "", value, cause)




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
                have = ", ".join(sorted(f"{module_label(m)} {r}" for m, r in self.means))
                raise RunError(f"evaluate.mean: the file has no capture of {module_label(module)} {role}; it has {have}")
            mean = self._on[key] = torch.as_tensor(self.means[(module, role)]).to(x.device, x.dtype)
        try:
            return mean.expand_as(x).clone()
        except RuntimeError:
            raise RunError(f"evaluate.mean: the mean of {module_label(module)} {role} has shape {tuple(mean.shape)}, which "
                           f"does not fit the tensor's {tuple(x.shape)}; record it with rows: token (one row per "
                           f"token) or with the same shape") from None


def read_means(path: str, wanted: list[tuple[str, str]]) -> dict[tuple[str, str], np.ndarray]:
    """The mean row of each capture of `path` whose module and role family (output, input) a modify
    action replaces: float64, read block by block."""
    try:  # a local file, a merged view of ranks, or an object-store cache (store/reading.py)
        source = open_source(path)
    except NotFoundError:
        raise ConfigError(f"evaluate.mean: no file {str(Path(path).expanduser())!r} (an earlier hookrun run that "
                          f"recorded the modified modules' outputs)") from None
    except HookrunError as exc:
        raise ConfigError(f"evaluate.mean: {exc}") from None
    file = source.path
    with source:
        f = source.file
        status = f.attrs.get("status", "complete")
        status = status.decode() if isinstance(status, bytes) else str(status)
        if status != "complete":  # (its mean would be that of the batches it wrote before it stopped)
            raise ConfigError(f"evaluate.mean: {str(file)!r} is a run whose status is {status!r}, not complete: its "
                              f"mean would be that of the batches it wrote; finish it (resume=true) or point "
                              f"evaluate.mean at a complete run")
        try:
            captures = list_captures(f)
        except HookrunError as exc:  # a damaged object header, named
            raise ConfigError(f"evaluate.mean: {str(file)!r}: {exc}; record the means again (or point evaluate.mean at an intact copy)") from None
        out = {}
        for module, fam in dict.fromkeys(wanted):
            found = [c for c in captures if c.module == module and family(c.role) == fam]
            usable = [c for c in found if c.rows in (RowKind.SAMPLES.value, RowKind.TOKENS.value) and len(c.shape) >= 2]
            if not usable:
                have = ", ".join(sorted({f"{module_label(c.module)} {c.role}" for c in captures})) or "no captures"
                raise ConfigError(f"evaluate.mean: {str(file)!r} has no {'usable ' if found else ''}capture of "
                                  f"{module_label(module)} {fam} (it has {have}); record it there with "
                                  f"{{name: record, what: {fam}, rows: token}}")
            hooks = sorted({c.hook for c in usable})
            if len(hooks) > 1:  # (the first one's rows were taken in silence)
                raise ConfigError(f"evaluate.mean: {str(file)!r} holds {module_label(module)} {fam} from {len(hooks)} hooks "
                                  f"({', '.join(hooks)}): which one's mean is meant cannot be told; point evaluate.mean "
                                  f"at a run that records it once")
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
