"""The probe's results in the file: one group per hook point under /probe, written once, with the
last batch's record (the store's normal path: a failed batch rolls it back).

    /probe                   attrs: method, metric (accuracy | r2), pool, points (JSON: the hook points in order)
    /probe/NNN               attrs: module, rows, train_rows, test_rows, features, train_score,
                             test_score, control_train_score, control_test_score, selectivity,
                             majority_test_score (the training rows' commonest class on the
                             test rows: chance), classes (JSON), objective, iterations, converged, spilled,
                             fit_seconds (the solver's wall time, control task included),
                             control_converged, control_iterations (a logistic control task's fit)
    /probe/NNN/weight        (classes or 1, features) float64: scores = x @ weight.T + bias on the
    /probe/NNN/bias          pooled activations x (standardisation folded in)
    /probe/NNN/mean, scale   (features,): the training rows' StandardScaler (0 and 1 without standardize)

NNN is the hook point's place in the order the outputs come in the forward (a block's after the modules inside it;
for most models named_modules' order), whatever order `at` lists them in.
"""

from __future__ import annotations

import json
from typing import Any

import h5py
import numpy as np

from hookrun.store.kind_tables import KindTable, register_table
from hookrun.store.overhead import table_bytes

GROUP = "probe"
SCALARS = ("rows", "train_rows", "test_rows", "features", "train_score", "test_score", "control_train_score",
           "control_test_score", "selectivity", "majority_test_score", "objective", "iterations", "converged", "spilled", "fit_seconds",
           "control_converged", "control_iterations")
ARRAYS = ("weight", "bias", "mean", "scale")


class ProbeTableWriter:
    def __init__(self, file: h5py.File) -> None:
        self.file = file

    def write(self, step: int, rows: dict[str, Any]) -> None:
        """rows: {"attrs": {...}, "points": [(module, result dict from fit.fit_point), ...]}."""
        g = self.file.require_group(GROUP)
        for k, v in rows["attrs"].items():
            g.attrs[k] = json.dumps(v) if isinstance(v, list | dict) else v
        g.attrs["points"] = json.dumps([m for m, _ in rows["points"]])
        g.attrs["whole"] = True  # the whole run's result (a many-rank run's view copies it from rank 0's shard)
        for i, (module, r) in enumerate(rows["points"]):
            pg = g.create_group(f"{i:03d}")
            pg.attrs["module"] = module
            for k in SCALARS:
                if k in r:
                    pg.attrs[k] = r[k]
            if "classes" in r:
                pg.attrs["classes"] = json.dumps(r["classes"])
            for k in ARRAYS:
                pg.create_dataset(k, data=np.asarray(r[k], dtype=np.float64))

    def mark(self) -> Any:
        return GROUP in self.file

    def roll_back(self, mark: Any) -> None:
        if not mark and GROUP in self.file:
            del self.file[GROUP]

    def flush(self) -> None:
        pass


def point_groups(f: h5py.File) -> list[h5py.Group]:
    """The /probe/NNN groups in their outputs' order ([] where the file holds no /probe)."""
    return [f[GROUP][k] for k in sorted(f[GROUP])] if GROUP in f else []


def point_group(f: h5py.File, module: str) -> h5py.Group | None:
    """The group of the probe at hook point `module`, or None."""
    return next((g for g in point_groups(f) if str(g.attrs["module"]) == module), None)


def classes(g: h5py.Group) -> list | None:
    """A probe's classes (a logistic probe's, in its weight rows' order), or None for a regression."""
    return json.loads(g.attrs["classes"]) if "classes" in g.attrs else None


def read_rows(f: h5py.File, rows: int | None = None) -> dict[int, Any]:
    """Resume replays no probe rows: the results are written with the last batch only (a file that
    holds them is complete)."""
    return {}


TABLE = register_table(KindTable(GROUP, ProbeTableWriter, read_rows))


def class_count(y_kind: str, listed: Any, known: np.ndarray | None, data: Any) -> int:
    """The columns a probe's weights will have, known before the pass (0 where not): 1 for float targets
    (a regression); else the data set's listed classes, its known targets' distinct values or its
    `num_classes`."""
    count = getattr(data, "num_classes", None)
    if y_kind == "f":
        return 1
    if isinstance(listed, list | tuple):
        return len(listed)
    return len(np.unique(known)) if known is not None else count if isinstance(count, int) and count > 0 else 0


def probe_bytes(features: dict[str, int], classes: int, described: int) -> int:
    """The file bytes a probe writes at its end (output.max_bytes, dry_run): per hook point its weight
    (classes x features), bias, mean and scale (float64), its group, its attributes and their classes;
    /probe and its attributes; the root's `probe` (`described` characters of JSON). Classes unknown: 8."""
    c, p = classes or 8, len(features)
    data = sum(8 * (c * f + c + 2 * f) for f in features.values())
    return data + table_bytes(1 + p, 4 * p, p * (len(SCALARS) + 2) + 6, p * (16 * c + 256) + 2 * described)


def plan(kind: Any, n_samples: int) -> list[str]:
    """dry_run's probe lines: the fit and the split, then per hook point its features and the rows the run gives it
    (`pool: every`: as many per item as the first batch's), float64, against its share of probe.memory (beyond it the
    rows go to a spill file beside the run)."""
    from hookrun.analysis.stats import human_bytes  # (the printout only)

    b, share = kind.spec, kind.spec.memory // len(kind.names)
    fit = f"logistic (C={b.C:g})" if b.method == "logistic" else f"ridge (alpha={b.alpha:g})"
    split = "probe.test_data's items to test" if b.test_data is not None else \
        f"split.test {b.split.test:g} (seed {b.split.seed})"
    out = [f"  probe {fit}, pool {b.pool}, {split}{', the control task' if b.control else ''}; each of the "
           f"{len(kind.names)} point(s) holds {human_bytes(share)} of rows in memory (probe.memory), beyond it a spill file"]
    indices, first = kind.first if kind.first is not None else (None, {})
    for name in kind.names:
        per_item = first[name][0].shape[0] / len(indices) if name in first and len(indices) else 1.0
        rows = round(n_samples * per_item)
        need = rows * kind.features[name] * 8
        about = "about " if b.pool == "every" else ""
        out.append(f"    {name:34s} {kind.features[name]} features x {about}{rows} rows = {about}{human_bytes(need)}"
                   f"{' (spilled: over its share)' if need > share else ''}")
    return out
