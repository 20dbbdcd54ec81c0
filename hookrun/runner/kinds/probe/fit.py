"""One hook point's probe, fitted at the end of the pass from its rows (rows.py): the split, the
control task, standardisation, ridge (moments.py) or logistic (logistic.py), and the scores.

    spec = FitSpec(method="logistic", C=1.0, test=0.25, seed=0, control=True)
    result = fit_point(store, spec)      # a dict: train / test accuracy (R^2), control, selectivity, weights

- The split: the items seen, sorted, split as sklearn.model_selection.train_test_split(items,
  test_size=test, random_state=seed) splits them (its ShuffleSplit's draw, without importing
  scikit-learn: about 100 MB a run would hold for one permutation); every row of a test item is a
  test row. With test_data, the rows added with part=1 are the test rows.
- Targets: an integer target is a class (classes: those of the training rows, sorted, as sklearn's
  LabelEncoder); a float target is regression (ridge only; its score is R^2, sklearn's r2_score).
- The majority class: the test rows' accuracy of always naming the training rows' most frequent class
  (sklearn's DummyClassifier(strategy="most_frequent"); a tie goes to the smaller class): the chance
  a probe's and the control's accuracy are read against.
- The control task (Hewitt & Liang 2019): each identity key (a token id, or an item index where a
  row is an item) gets a class drawn once from the training rows' class frequencies
  (numpy default_rng(seed)); the same probe is fitted to those classes; selectivity = test accuracy
  - control test accuracy.
- Weights are stored in the space of the pooled activations (standardisation folded in):
  scores = x @ weight.T + bias; `coef` / `intercept` are the standardised space's, as sklearn's
  pipeline StandardScaler -> estimator holds them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from hookrun.errors import ConfigError
from hookrun.runner.kinds.probe.logistic import fit_logistic, solver_threads
from hookrun.runner.kinds.probe.moments import Moments, ridge_solve, scaler_scale
from hookrun.runner.kinds.probe.rows import RowStore


@dataclass
class FitSpec:
    method: str = "logistic"  # logistic | ridge
    C: float = 1.0
    alpha: float = 1.0
    standardize: bool = True
    test: float | None = 0.25  # None: the rows with part=1 (test_data) are the test rows
    seed: int = 0
    control: bool = False
    tol: float = 1e-8
    max_iter: int = 1000


def split_items(items: np.ndarray, test: float, seed: int) -> np.ndarray:
    """The test items of sklearn's train_test_split(items, test_size=test, random_state=seed)[1]: its
    ShuffleSplit takes the first ceil(test * n) of RandomState(seed).permutation(n) (model_selection/_split.py)."""
    return np.asarray(items)[np.random.RandomState(seed).permutation(len(items))[:math.ceil(test * len(items))]]


def test_rows(item: np.ndarray, test: float, seed: int) -> np.ndarray:
    """Which rows are test rows: those of the split's test items (split_items over the distinct items)."""
    return np.isin(item, split_items(np.unique(item), test, seed))


def control_classes(keys: np.ndarray, y_idx: np.ndarray, train: np.ndarray, classes: int, seed: int) -> np.ndarray:
    """Each row's control class: one draw per distinct key from the training rows' class frequencies."""
    uniq, inverse = np.unique(keys, return_inverse=True)
    freq = np.bincount(y_idx[train], minlength=classes).astype(np.float64)
    draws = np.random.default_rng(seed).choice(classes, size=len(uniq), p=freq / freq.sum())
    return draws[inverse]


def fit_point(store: RowStore, spec: FitSpec, device: torch.device | str = "cpu", where: str = "") -> dict:
    y, item, part = store.column("y"), store.column("item"), store.column("part")
    test = (part == 1) if spec.test is None else test_rows(item, spec.test, spec.seed)
    train = ~test
    regression = y.dtype.kind == "f"
    if regression and spec.method == "logistic":
        raise ConfigError(f"probe.target{where}: the target is a number (float), which method=logistic cannot fit; "
                          f"use method=ridge for regression, or give integer classes")
    out: dict = {"test_items": np.unique(item[test]), "rows": store.rows, "train_rows": int(train.sum()), "test_rows": int(test.sum()),
                 "features": store.features, "spilled": store.spilled}
    if not train.any() or not test.any():
        raise ConfigError(f"probe{where}: the split leaves {int(train.sum())} training and {int(test.sum())} test rows; "
                          f"probe more items or change probe.split.test")
    classes = None if regression else training_classes(y, train, where)  # (before any pass over the rows)
    d = store.features
    blocks = lambda: store.blocks(device)  # noqa: E731
    if spec.standardize:
        m = Moments(diag=True)
        for start, x in blocks():
            m.add(x[torch.from_numpy(train[start:start + len(x)]).to(x.device)])
        mean = m.mean.cpu().numpy()
        scale = scaler_scale(mean, m.comoment.cpu().numpy() / m.n, m.n)
    else:
        mean, scale = np.zeros(d), np.ones(d)
    targets: dict[str, np.ndarray] = {}
    fitted = {"probe": classes}  # each fit's classes
    if regression:
        targets["probe"] = y
    else:
        lookup = {c: i for i, c in enumerate(classes.tolist())}
        targets["probe"] = np.array([lookup.get(int(v), -1) for v in y], dtype=np.int64)
        out["classes"] = classes.tolist()
        out["majority_test_score"] = majority_score(targets["probe"], train, test, len(classes))
        out["unseen_test_rows"] = int((targets["probe"][test] < 0).sum())  # (a class no training row has)
        if spec.control:
            c = control_classes(store.column("key"), targets["probe"], train, len(classes), spec.seed)
            drawn, fitted["control"] = np.unique(c[train]), classes
            if 1 < len(drawn) < len(classes):  # (a rare class no training row drew: sklearn fits the classes its rows
                # hold, binary for two, the others' test rows wrong; a multinomial of every class kept an empty one)
                c, fitted["control"] = np.where(np.isin(c, drawn), np.searchsorted(drawn, c), -1), drawn
            targets["control"] = c
    held = store.held_subset(train, device) if spec.method == "logistic" else None  # the solver's rows alone
    with solver_threads(store.rows, d, device):
        fits = {name: fit_one(blocks, t, train, fitted[name], d, spec, mean, scale, held) for name, t in targets.items()}
    scores = evaluate(blocks, targets, fits, train, test, regression)
    for name, f in fits.items():
        pre = "" if name == "probe" else "control_"
        out.update({f"{pre}train_score": scores[name][0], f"{pre}test_score": scores[name][1]})
        if name == "probe":
            out.update({k: v for k, v in f.items()})
        elif "converged" in f:  # (the control fit stops at max_iter too: its scores are then not the optimum's)
            out.update({"control_converged": f["converged"], "control_iterations": f["iterations"]})
    if "control" in fits:
        out["selectivity"] = out["test_score"] - out["control_test_score"]
    out.update({"mean": mean, "scale": scale, "regression": regression})
    return out


def majority_score(y_idx: np.ndarray, train: np.ndarray, test: np.ndarray, classes: int) -> float:
    """The test rows' accuracy of the training rows' most frequent class (the smaller on a tie)."""
    return float((y_idx[test] == np.bincount(y_idx[train], minlength=classes).argmax()).mean())


def training_classes(y: np.ndarray, train: np.ndarray, where: str = "") -> np.ndarray:
    """The classes of the training rows; fewer than 2 is one line, naming the classes the split put
    only in the test rows (a rare class's items all drawn for the test)."""
    classes = np.unique(y[train].astype(np.int64))
    if len(classes) < 2:
        only_test = np.setdiff1d(np.unique(y.astype(np.int64)), classes).tolist()
        why = (f"the split put every row of class(es) {only_test} in the test rows; give more items of "
               f"{'that class' if len(only_test) == 1 else 'those classes'}, or another probe.split.seed"
               if only_test else "probe more items or another target")
        raise ConfigError(f"probe.target{where}: the training rows hold {len(classes)} class(es) "
                          f"({classes.tolist()}) and a probe needs at least 2: {why}")
    return classes


def fit_one(blocks, t: np.ndarray, train: np.ndarray, classes: np.ndarray | None, d: int, spec: FitSpec,
            mean: np.ndarray, scale: np.ndarray, held: list | None = None) -> dict:
    """The probe on targets `t` (class indices, or values): its weights in both spaces. `held`: the
    training rows copied apart (RowStore.held_subset), which the logistic solver's passes read instead."""
    info: dict = {}
    if spec.method == "ridge":
        m = Moments()
        for start, x in blocks():
            sel = torch.from_numpy(train[start:start + len(x)]).to(x.device)
            tt = torch.from_numpy(t[start:start + len(x)]).to(x.device)[sel]
            tt = tt[:, None].to(torch.float64) if classes is None else \
                torch.nn.functional.one_hot(tt, len(classes)).to(torch.float64)
            m.add(torch.cat([x[sel], tt], 1))
        coef, intercept = ridge_solve(m, d, spec.alpha, scale if spec.standardize else None)
    else:
        args = (blocks, t, train) if held is None else (lambda: held, t[train], np.ones(int(train.sum()), bool))
        f = fit_logistic(*args, len(classes), d, spec.C, spec.tol, spec.max_iter,
                         *((mean, scale) if spec.standardize else (None, None)))
        coef, intercept = f.coef, f.intercept
        info = {"objective": f.objective, "iterations": f.iterations, "converged": f.converged}
    weight = coef / scale if spec.standardize else coef
    bias = intercept - weight @ mean if spec.standardize else intercept
    return {"coef": coef, "intercept": intercept, "weight": weight, "bias": bias, **info}


def evaluate(blocks, targets: dict[str, np.ndarray], fits: dict[str, dict], train: np.ndarray, test: np.ndarray,
             regression: bool) -> dict[str, tuple[float, float]]:
    """(train, test) accuracy, or R^2 (sklearn's r2_score) for regression, of each fit: one pass."""
    preds = {name: [] for name in fits}
    for _, x in blocks():
        for name, f in fits.items():
            w = torch.from_numpy(f["weight"]).to(x.device)
            z = x @ w.T + torch.from_numpy(f["bias"]).to(x.device)
            p = z[:, 0] if regression else (z[:, 0] > 0).long() if z.shape[1] == 1 else z.argmax(1)
            preds[name].append(p.cpu().numpy())
    out = {}
    for name, t in targets.items():
        p = np.concatenate(preds[name])
        out[name] = tuple(score(p[rows], t[rows], regression) for rows in (train, test))
    return out


def score(pred: np.ndarray, true: np.ndarray, regression: bool) -> float:
    if not regression:
        return float((pred == true).mean())
    ss_tot = float(((true - true.mean()) ** 2).sum())
    ss_res = float(((true - pred) ** 2).sum())
    if ss_tot == 0:  # (sklearn's r2_score with force_finite)
        return 1.0 if ss_res == 0 else 0.0
    return 1.0 - ss_res / ss_tot
