"""Linear CKA's Gram matrices from many float32 rows are made with float32 products (gram.FAST_ROWS): held
here to the 1e-6 of each CKA the issue asks, against Kornblith et al.'s CKA on the float64 rows, over the
series that lose most to float32: a feature's offset (1000 +- 0.01), outlier features 1000 times the rest
beside a series they share little with (a CKA of a few hundredths), column scales spread over four orders
of magnitude, and a ReLU map with dead features."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hookrun.runner.kinds.similarity import gram
from hookrun.runner.kinds.similarity.accumulate import accumulator, pairs_of

N = 512


def centred_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al.'s linear CKA on float64 rows centred first (no offset cancels in the products)."""
    x, y = (a.reshape(len(a), -1).astype(np.float64) for a in (x, y))
    x, y = x - x.mean(0), y - y.mean(0)
    k, l_ = x @ x.T, y @ y.T
    return float(np.vdot(k, l_) / np.sqrt(np.vdot(k, k) * np.vdot(l_, l_)))


def series(seed: int) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    base = g.normal(size=(N, 16))
    relu = np.maximum(base @ g.normal(size=(16, 8 * 12 * 12)) + 0.3, 0).reshape(N, 8, 12, 12)
    relu[:, :3] = 0.0  # three dead channels
    offset = 1000.0 + 0.01 * (base[:, :6] @ g.normal(size=(6, 1500)) + 0.3 * g.normal(size=(N, 1500)))
    outliers = np.maximum(g.normal(size=(N, 3000)), 0)
    outliers[:, :3] = 1000 * (base[:, :1] @ g.normal(size=(1, 3)) + g.normal(size=(N, 3)))
    scales = (base[:, 8:] @ g.normal(size=(8, 2000)) + g.normal(size=(N, 2000))) * np.exp(2 * g.normal(size=2000))
    return [a.astype(np.float32) for a in (relu, offset, outliers, scales)]


def matrix(xs: list[np.ndarray], batch: int = 64) -> np.ndarray:
    acc = accumulator("gram", pairs_of(len(xs), None), batch=batch, held=1 << 30)
    for s in range(0, N, batch):
        acc.add([torch.from_numpy(x[s:s + batch]) for x in xs])
    try:
        return acc.matrix((len(xs), len(xs)))
    finally:
        acc.close()


@pytest.mark.parametrize("seed", [0, 1])
def test_float32_products_hold_each_cka_to_1e_6(monkeypatch, seed: int) -> None:
    xs = series(seed)
    calls = []
    mixed = gram.GramRoute.mixed_gram
    monkeypatch.setattr(gram.GramRoute, "mixed_gram", lambda self, k: calls.append(k) or mixed(self, k))
    got = matrix(xs)
    assert calls == [0, 1, 2, 3]  # (every series took the float32 products: the test is of them)
    want = np.array([[centred_cka(a, b) for b in xs] for a in xs])
    assert want.min() < 0.05  # (a small CKA, whose relative error float32 inflates most)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_outlier_columns_are_multiplied_in_float64(monkeypatch) -> None:
    """The outlier series' three features of 1000 are its slab's only wide columns, and taking wide columns
    apart is what holds the small CKA (0.0098) of that series and the one of spread column scales: all in
    float32 it is off by more than 5e-7 (1.9e-6 and 2.8e-6 for seeds 0 and 1 here; the test can fail),
    apart within 2e-7."""
    xs = series(0)
    part = xs[2] - xs[2].mean(0)
    squares = np.einsum("ij,ij->j", part, part)
    assert (squares > gram.WIDE * np.median(squares)).sum() == 3
    pair = [xs[2], xs[3]]
    want = centred_cka(*pair)
    assert want < 0.05
    assert abs(matrix(pair)[0, 1] / want - 1) < 2e-7
    monkeypatch.setattr(gram, "WIDE", np.inf)
    assert abs(matrix(pair)[0, 1] / want - 1) > 5e-7


def test_few_rows_keep_float64_products(monkeypatch) -> None:
    """Under FAST_ROWS items the Gram matrix is cheap and float32's rounding averages over fewer pairs: the
    float64 products, as before (the offset series to 1e-9)."""
    monkeypatch.setattr(gram.GramRoute, "mixed_gram", lambda self, k: pytest.fail("float32 products"))
    xs = [x[:gram.FAST_ROWS - 1] for x in series(0)[:2]]
    acc = accumulator("gram", pairs_of(2, None), batch=50, held=1 << 30)
    for s in range(0, len(xs[0]), 50):
        acc.add([torch.from_numpy(x[s:s + 50]) for x in xs])
    got = acc.matrix((2, 2))
    acc.close()
    assert got[0, 1] == pytest.approx(centred_cka(*xs), rel=1e-9)


def test_unbiased_cka_from_float32_products() -> None:
    """estimator: unbiased takes the same Gram matrices (U-centred: a feature's shift does not move them):
    Song et al.'s unbiased HSIC on the float64 rows, term by term, in CKA's ratio, to 1e-6 (1e-9 absolute
    for the near-0 pairs the unbiased estimator gives)."""
    from test_similarity_engine import unbiased

    xs = series(1)
    acc = accumulator("gram", pairs_of(4, None), batch=N, held=1 << 30, unbiased=True)
    acc.add([torch.from_numpy(x) for x in xs])
    got = acc.matrix((4, 4))
    acc.close()
    rows = [x.reshape(N, -1).astype(np.float64) for x in xs]
    k = [(a - a.mean(0)) @ (a - a.mean(0)).T for a in rows]  # (centred first: no offset cancels in numpy's products)
    want = np.array([[unbiased(a, b) / np.sqrt(unbiased(a, a) * unbiased(b, b)) for b in k] for a in k])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
