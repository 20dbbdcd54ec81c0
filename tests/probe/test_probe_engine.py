"""The probe's engine against scikit-learn on the same float64 rows: Ridge (coefficients, intercept,
predictions), LogisticRegression(solver="lbfgs", tol=1e-10) (the objective at our weights by sklearn's
own LinearModelLoss, the test predictions), StandardScaler, train_test_split; streaming from the spill
file against holding the rows; pooling against numpy on the same tensors."""

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")
from sklearn._loss.loss import HalfBinomialLoss, HalfMultinomialLoss  # noqa: E402
from sklearn.linear_model import LogisticRegression, Ridge  # noqa: E402
from sklearn.linear_model._linear_loss import LinearModelLoss  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from hookrun.runner.kinds.probe.fit import FitSpec, fit_point  # noqa: E402
from hookrun.runner.kinds.probe.pool import pool_rows  # noqa: E402
from hookrun.runner.kinds.probe.rows import RowStore  # noqa: E402


def data(n=240, d=12, classes=3, seed=0, regression=False):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * rng.uniform(0.2, 5, size=d) + rng.normal(size=d) * 3
    x[:, 3] = 2.5  # a constant feature: StandardScaler leaves it unscaled
    w = rng.normal(size=(d, max(classes, 1)))
    z = (x - x.mean(0)) @ w + rng.normal(size=(n, w.shape[1])) * 2
    y = z[:, 0] if regression else z.argmax(1).astype(np.int64)
    return x, y


def store_of(x, y, tmp_path, memory=1 << 30, batch=32, items=None):
    s = RowStore(x.shape[1], memory, spill=tmp_path / "rows.h5", name="p")
    items = np.arange(len(x)) if items is None else items
    for i in range(0, len(x), batch):
        s.add(torch.from_numpy(x[i:i + batch]), y[i:i + batch], items[i:i + batch], items[i:i + batch])
    return s


def split(n, test=0.25, seed=0):
    tr, te = train_test_split(np.arange(n), test_size=test, random_state=seed)
    mask = np.zeros(n, bool)
    mask[te] = True
    return ~mask, mask


def scaled(x, train, standardize):
    if not standardize:
        return x
    return StandardScaler().fit(x[train]).transform(x)


def close(a, b, rel=1e-6):
    a, b = np.asarray(a, float), np.asarray(b, float)
    assert np.abs(a - b).max() <= rel * max(np.abs(b).max(), 1e-12), (np.abs(a - b).max(), np.abs(b).max())


@pytest.mark.parametrize("standardize", [True, False])
def test_ridge_regression_equals_sklearn(tmp_path, standardize):
    x, y = data(regression=True)
    r = fit_point(store_of(x, y, tmp_path), FitSpec(method="ridge", alpha=3.0, standardize=standardize))
    train, test = split(len(x))
    xs = scaled(x, train, standardize)
    ref = Ridge(alpha=3.0).fit(xs[train], y[train])
    close(r["coef"][0], ref.coef_)
    close(r["intercept"][0], ref.intercept_)
    close(x[test] @ r["weight"][0] + r["bias"][0], ref.predict(xs[test]))
    assert r["test_score"] == pytest.approx(ref.score(xs[test], y[test]), rel=1e-6)
    assert r["train_score"] == pytest.approx(ref.score(xs[train], y[train]), rel=1e-6)


@pytest.mark.parametrize("standardize", [True, False])
def test_ridge_classification_is_one_hot_ridge(tmp_path, standardize):
    x, y = data(classes=4, seed=1)
    r = fit_point(store_of(x, y, tmp_path), FitSpec(method="ridge", alpha=0.5, standardize=standardize))
    train, test = split(len(x))
    xs = scaled(x, train, standardize)
    classes = np.unique(y[train])
    onehot = (y[:, None] == classes[None]).astype(float)
    ref = Ridge(alpha=0.5).fit(xs[train], onehot[train])
    close(r["coef"], ref.coef_)
    close(r["intercept"], ref.intercept_)
    pred = classes[ref.predict(xs[test]).argmax(1)]
    assert r["test_score"] == pytest.approx((pred == y[test]).mean())


def sklearn_objective(coef, intercept, x, y_idx, classes, C):
    """sklearn's own loss (LinearModelLoss, as LogisticRegression's lbfgs minimises it)."""
    binary = classes == 2
    loss = LinearModelLoss(HalfBinomialLoss() if binary else HalfMultinomialLoss(n_classes=classes), True)
    w = np.concatenate([coef, intercept[:, None]], 1)
    return loss.loss(w[0] if binary else w, x, y_idx.astype(float), l2_reg_strength=1.0 / (C * len(x)))


@pytest.mark.parametrize("classes,standardize", [(2, True), (3, True), (5, False), (2, False)])
def test_logistic_reaches_sklearns_optimum(tmp_path, classes, standardize):
    x, y = data(n=300, classes=classes, seed=classes)
    r = fit_point(store_of(x, y, tmp_path), FitSpec(method="logistic", C=0.3, standardize=standardize))
    train, test = split(len(x))
    xs = scaled(x, train, standardize)
    ref = LogisticRegression(C=0.3, solver="lbfgs", tol=1e-10, max_iter=100000).fit(xs[train], y[train])
    y_idx = np.searchsorted(ref.classes_, y[train])
    ours = sklearn_objective(r["coef"], r["intercept"], xs[train], y_idx, classes, 0.3)
    theirs = sklearn_objective(ref.coef_, ref.intercept_, xs[train], y_idx, classes, 0.3)
    assert ours <= theirs * (1 + 1e-6)
    assert r["objective"] == pytest.approx(ours, rel=1e-9)  # the objective it reports is sklearn's
    pred = x[test] @ r["weight"].T + r["bias"]
    pred = (pred[:, 0] > 0).astype(int) if classes == 2 else pred.argmax(1)
    assert (ref.classes_[pred] == ref.predict(xs[test])).mean() >= 0.995
    assert r["test_score"] == pytest.approx(ref.score(xs[test], y[test]), abs=0.005)


@pytest.mark.parametrize("method", ["logistic", "ridge"])
def test_streaming_from_disk_equals_in_memory(tmp_path, method):
    x, y = data(n=200, d=8, classes=3)
    spec = FitSpec(method=method, C=2.0, alpha=1.0, control=True)
    held = fit_point(store_of(x, y, tmp_path), spec)
    small = store_of(x, y, tmp_path, memory=8 * 8 * 20)  # 20 rows of 8 features: spills, blocks of 20 rows
    assert small.spilled and not small.chunks
    streamed = fit_point(small, spec)
    small.close()
    assert streamed["spilled"] and not held["spilled"]
    close(streamed["coef"], held["coef"], 1e-6)
    for k in ("train_score", "test_score", "control_test_score", "selectivity"):
        assert streamed[k] == pytest.approx(held[k], abs=1e-9)
    assert not (tmp_path / "rows.h5").exists()


@pytest.mark.parametrize("test,seed", [(0.25, 0), (0.5, 3), (0.1, 7)])
def test_split_is_train_test_split_over_items(tmp_path, test, seed):
    x, y = data(n=90, d=4, classes=2)
    items = np.repeat(np.arange(30) * 5 + 2, 3)  # three rows per item, item indices not 0..n
    r = fit_point(store_of(x, y, tmp_path, items=items), FitSpec(method="ridge", test=test, seed=seed))
    want = train_test_split(np.unique(items), test_size=test, random_state=seed)[1]
    assert sorted(r["test_items"].tolist()) == sorted(want.tolist())
    assert r["test_rows"] == 3 * len(want)


def test_control_task_keyed_to_identity(tmp_path):
    """Item keys: the control classes of held-out items are unpredictable (chance); token keys that recur
    in the test rows are learnable from features that encode the key."""
    rng = np.random.default_rng(0)
    n, classes = 600, 3
    ids = rng.integers(0, 12, size=n)  # a 'token id' per row, encoded in the features
    x = np.eye(12)[ids] + rng.normal(size=(n, 12)) * 0.05
    y = rng.integers(0, classes, size=n)
    items = np.arange(n)
    s = RowStore(12, 1 << 30)
    s.add(torch.from_numpy(x), y, ids, items)
    tok = fit_point(s, FitSpec(method="logistic", C=10.0, control=True))
    assert tok["control_test_score"] > 0.95  # memorised token identities
    s2 = RowStore(12, 1 << 30)
    s2.add(torch.from_numpy(x), y, items, items)
    item = fit_point(s2, FitSpec(method="logistic", C=10.0, control=True))
    assert item["control_test_score"] < 0.5
    assert item["selectivity"] == pytest.approx(item["test_score"] - item["control_test_score"])


@pytest.mark.parametrize("trial", [4, 13, 14, 22, 27])
def test_a_control_task_whose_training_rows_drew_no_row_of_a_rare_class_is_sklearns_fit(trial):
    """A class of 4% of the items: the control's draws (one per item, from the training rows' frequencies)
    can leave it out of the control's training rows. sklearn's LogisticRegression on those control classes
    fits the classes they hold (binary for two); the probe fitted a 3-class multinomial with an empty class,
    another optimum (its control accuracy differed). Reference: the spec's draw (default_rng(seed).choice
    over the items with the training rows' frequencies), StandardScaler -> LogisticRegression."""
    rng = np.random.default_rng(trial)
    n, d = int(rng.integers(40, 120)), int(rng.integers(2, 30))
    y = rng.choice(3, size=n, p=[0.48, 0.48, 0.04])
    for seed in range(60):  # a split whose training rows hold every class, and whose control draws miss class 2
        _, test_items = train_test_split(np.arange(n), test_size=0.25, random_state=seed)
        train = ~np.isin(np.arange(n), test_items)
        freq = np.bincount(y[train], minlength=3)
        control = np.random.default_rng(seed).choice(3, size=n, p=freq / freq.sum())
        if freq.min() > 0 and not (control[train] == 2).any():
            break
    x = rng.normal(size=(n, d))
    C = float(10 ** rng.uniform(-1, 2))
    s = RowStore(d, 1 << 30)
    s.add(torch.from_numpy(x), y, np.arange(n), np.arange(n))
    out = fit_point(s, FitSpec(method="logistic", C=C, seed=seed, control=True))
    ref = LogisticRegression(C=C, tol=1e-10, max_iter=100000)
    scaler = StandardScaler().fit(x[train])
    ref.fit(scaler.transform(x[train]), control[train])
    assert list(ref.classes_) == [0, 1]
    assert out["control_train_score"] == pytest.approx(ref.score(scaler.transform(x[train]), control[train]), abs=1e-12)
    assert out["control_test_score"] == pytest.approx(ref.score(scaler.transform(x[~train]), control[~train]), abs=1e-12)
    assert out["control_converged"]


def test_pooling_against_numpy():
    rng = np.random.default_rng(0)
    fmap = torch.from_numpy(rng.normal(size=(3, 4, 5, 6)))
    close(pool_rows(fmap, "mean", None).x, fmap.numpy().mean((2, 3)), 1e-12)
    close(pool_rows(fmap, "max", None).x, fmap.numpy().max((2, 3)), 1e-12)
    t = rng.normal(size=(2, 5, 3))
    t[0, 3:] = 1e6  # padding: right for sample 0, left for sample 1
    t[1, :2] = -1e6
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]])
    tt = torch.from_numpy(t)
    close(pool_rows(tt, "last", mask).x, np.stack([t[0, 2], t[1, 4]]), 1e-12)
    close(pool_rows(tt, "mean", mask).x, np.stack([t[0, :3].mean(0), t[1, 2:].mean(0)]), 1e-12)
    close(pool_rows(tt, "max", mask).x, np.stack([t[0, :3].max(0), t[1, 2:].max(0)]), 1e-12)
    every = pool_rows(tt, "every", mask)
    close(every.x, np.concatenate([t[0, :3], t[1, 2:]]), 1e-12)
    assert every.item.tolist() == [0, 0, 0, 1, 1, 1] and every.token.tolist() == [0, 1, 2, 7, 8, 9]


@pytest.mark.parametrize("diag", [False, True])
def test_moments_merged_over_uneven_batches_equal_numpy(diag):
    from hookrun.runner.kinds.probe.moments import Moments

    rng = np.random.default_rng(3)
    z = rng.normal(size=(157, 6)) * 10 + 1e4  # a large mean: the merged form keeps the digits
    m = Moments(diag=diag)
    for a, b in ((0, 1), (1, 40), (40, 41), (41, 157)):
        m.add(torch.from_numpy(z[a:b]))
    c = (z - z.mean(0)).T @ (z - z.mean(0))
    close(m.mean.numpy(), z.mean(0), 1e-12)
    close(m.comoment.numpy(), np.diag(c) if diag else c, 1e-9)
