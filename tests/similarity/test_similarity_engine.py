"""The similarity accumulators against numpy on the whole data, written here from the papers' definitions:
linear CKA (Kornblith et al. 2019, HSIC form with centred Gram matrices), rbf CKA (their gram_rbf),
RSA (scipy's pdist and spearmanr), the minibatch estimator (Song et al. 2012's unbiased HSIC on the
same batches, Nguyen, Raghu & Kornblith 2021's ratio of means), and the unbiased estimator (Song et
al.'s unbiased HSIC on every row, in CKA's ratio)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hookrun.errors import ConfigError
from hookrun.runner.kinds.similarity.accumulate import accumulator, choose_route, pairs_of


def hsic(k: np.ndarray, l_: np.ndarray) -> float:
    n = k.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    return np.trace(k @ h @ l_ @ h) / (n - 1) ** 2


def cka(k: np.ndarray, l_: np.ndarray) -> float:
    return hsic(k, l_) / np.sqrt(hsic(k, k) * hsic(l_, l_))


def gram_rbf(x: np.ndarray, threshold: float = 1.0) -> np.ndarray:  # Kornblith et al.'s code
    dot_products = x.dot(x.T)
    sq_norms = np.diag(dot_products)
    sq_distances = -2 * dot_products + sq_norms[:, None] + sq_norms[None, :]
    sq_median_distance = np.median(sq_distances)
    return np.exp(-sq_distances / (2 * threshold**2 * sq_median_distance))


def unbiased(k: np.ndarray, l_: np.ndarray) -> float:  # Song et al. 2012, eq. 5, term by term
    n = k.shape[0]
    kt, lt = k * (1 - np.eye(n)), l_ * (1 - np.eye(n))
    one = np.ones(n)
    return (np.trace(kt @ lt) + (one @ kt @ one) * (one @ lt @ one) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * one @ kt @ lt @ one) / (n * (n - 3))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    try:
        from scipy.stats import spearmanr
        return float(spearmanr(a, b).statistic)
    except ImportError:  # numpy's ranks (the data have no ties)
        ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
        return float(np.corrcoef(ra, rb)[0, 1])


def dissim(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "euclidean":
        return np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    return 1 - np.corrcoef(x)


def data(n: int, seed: int = 0) -> list[np.ndarray]:
    """Three related series: 6 features, 4 features x 5 positions (a feature map), 9 features."""
    g = np.random.default_rng(seed)
    a = g.normal(size=(n, 6)) + 3.0  # an offset: the centring must be exact
    b = (a @ g.normal(size=(6, 20)) + 0.5 * g.normal(size=(n, 20))).reshape(n, 4, 5)
    c = np.tanh(a @ g.normal(size=(6, 9))) + 0.3 * g.normal(size=(n, 9))
    return [a.astype(np.float32), b.astype(np.float32), c.astype(np.float32)]


def run(route: str, series: list[np.ndarray], batch: int, cols: int | None = None, **kw) -> np.ndarray:
    rows = len(series) - (cols or 0)
    acc = accumulator(route, pairs_of(rows, cols), batch=batch, **kw)
    for s in range(0, len(series[0]), batch):
        acc.add([torch.from_numpy(x[s:s + batch]) for x in series])
    out = acc.matrix((rows, cols or rows))
    if hasattr(acc, "close"):
        acc.close()
    return out


def flat(x: np.ndarray) -> np.ndarray:
    return x.reshape(len(x), -1).astype(np.float64)


@pytest.mark.parametrize("route", ["feature", "gram"])
@pytest.mark.parametrize("batch", [1, 7, 40])
def test_linear_cka_exact_whatever_the_batch(route: str, batch: int) -> None:
    series = data(40)
    got = run(route, series, batch)
    want = np.array([[cka(flat(x) @ flat(x).T, flat(y) @ flat(y).T) for y in series] for x in series])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert want[0, 1] < 0.99  # the pairs differ: the test can fail


def test_two_models_give_the_rectangle() -> None:
    series = data(30, seed=1)
    got = run("feature", series, 8, cols=1)  # rows: series 0, 1; columns: series 2
    want = [[cka(flat(x) @ flat(x).T, flat(series[2]) @ flat(series[2]).T)] for x in series[:2]]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("sigma", [0.8, 0.4])
def test_rbf_cka_equals_gram_rbf(sigma: float) -> None:
    series = data(31, seed=2)
    got = run("gram", series, 10, measure="rbf_cka", sigma=sigma)
    want = np.array([[cka(gram_rbf(flat(x), sigma), gram_rbf(flat(y), sigma)) for y in series] for x in series])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def offset(n: int, seed: int) -> list[np.ndarray]:
    """Three float32 series of 1,050 to 1,500 features (several slabs where the slab is made small): a ReLU
    map, a map of 0.01 over an offset of 1000, and a feature map of tanh."""
    g = np.random.default_rng(seed)
    base = g.normal(size=(n, 12))
    a = np.maximum(base @ g.normal(size=(12, 1100)) + 0.5, 0.0)
    b = 1000.0 + 0.01 * (base[:, :6] @ g.normal(size=(6, 1500)) + 0.3 * g.normal(size=(n, 1500)))
    c = np.tanh(base[:, 3:9] @ g.normal(size=(6, 3 * 7 * 50))).reshape(n, 3, 7, 50)
    return [x.astype(np.float32) for x in (a, b, c)]


@pytest.mark.parametrize("measure", ["linear_cka", "rbf_cka"])
def test_an_offset_does_not_cancel_in_the_gram_route(monkeypatch, measure: str) -> None:
    """A feature of 1000 +- 0.01: the gram route's rows less their first row give numpy's float64 values on
    the centred rows to 1e-9, where the Gram matrix of the rows as they are, centred afterwards (Kornblith
    et al.'s code), loses more than 1e-6 of them to cancellation (the test can fail)."""
    from hookrun.runner.kinds.similarity import gram

    monkeypatch.setattr(gram, "SLAB", 48 * 8 * 300)  # (slabs of 300 columns)
    series = offset(48, seed=6)
    got = run("gram", series, 10, measure=measure)
    kernel = (lambda x: gram_rbf(x, 0.8)) if measure == "rbf_cka" else (lambda x: x @ x.T)
    k = [kernel(flat(x) - flat(x).mean(0)) for x in series]
    want = np.array([[cka(a, b) for b in k] for a in k])
    np.testing.assert_allclose(got, want, rtol=1e-9)
    if measure == "linear_cka":
        k = [kernel(flat(x)) for x in series]
        assert np.abs(np.array([[cka(a, b) for b in k] for a in k]) / want - 1).max() > 1e-6


def test_rsa_euclidean_distances_are_not_lost_to_an_offset(monkeypatch) -> None:
    """Euclidean RSA over features of 1e5 +- 0.01 (float32): scipy's Spearman of the distances numpy
    takes from the rows' differences, exactly; the distances taken from the Gram matrix of the rows as
    they are lose a few per cent of their size to the offset, and their ranks move (the test can fail)."""
    from hookrun.runner.kinds.similarity import gram

    monkeypatch.setattr(gram, "SLAB", 40 * 8 * 300)  # (slabs of 300 columns)
    g = np.random.default_rng(9)
    base = g.normal(size=(40, 8))
    series = [(1e5 + 0.01 * (base @ g.normal(size=(8, 900)) + g.normal(size=(40, 900)))).astype(np.float32),
              np.tanh(base @ g.normal(size=(8, 30))).astype(np.float32)]
    got = run("gram", series, 10, measure="rsa", dissimilarity="euclidean")
    iu = np.triu_indices(40, k=1)
    d = [dissim(flat(x), "euclidean")[iu] for x in series]
    assert got[0, 1] == pytest.approx(spearman(d[0], d[1]), rel=1e-12)
    k = flat(series[0]) @ flat(series[0]).T
    naive = np.sqrt(np.maximum(np.diag(k)[:, None] + np.diag(k)[None] - 2 * k, 0))[iu]
    # (some ranks move: 2.4e-4 with one BLAS's order of sums, 3.3e-6 with another's (a CI run); one swap of
    # two neighbours among these 780 pairs moves the coefficient by about 1e-8, far above the 1e-12 held above)
    assert abs(spearman(naive, d[1]) - spearman(d[0], d[1])) > 1e-9


def test_rsa_correlations_are_not_lost_to_an_item_offset(monkeypatch) -> None:
    """Correlation RSA where each item's features sit on an offset of its own (1e4 to 2e4, over a spread
    of 0.01; float32): scipy's Spearman of numpy's 1 - Pearson on the rows, to 1e-9; the correlations
    taken from the Gram matrix of the rows as they are, each row's mean removed afterwards, move by far
    more, and their ranks with them (the test can fail)."""
    from hookrun.runner.kinds.similarity import gram

    monkeypatch.setattr(gram, "SLAB", 40 * 8 * 300)  # (slabs of 300 columns)
    g = np.random.default_rng(11)
    base = g.normal(size=(40, 8))
    lift = g.uniform(1e4, 2e4, size=(40, 1))
    series = [(lift + 0.01 * (base @ g.normal(size=(8, 900)) + g.normal(size=(40, 900)))).astype(np.float32),
              np.tanh(base @ g.normal(size=(8, 30))).astype(np.float32)]
    got = run("gram", series, 10, measure="rsa", dissimilarity="correlation")
    iu = np.triu_indices(40, k=1)
    d = [dissim(flat(x), "correlation")[iu] for x in series]
    assert got[0, 1] == pytest.approx(spearman(d[0], d[1]), rel=1e-9)
    x = flat(series[0])
    k, s = x @ x.T, x.sum(1)
    cov = k - np.outer(s, s) / x.shape[1]
    sd = np.sqrt(np.maximum(np.diag(cov), 0))
    naive = (1 - cov / np.outer(sd, sd))[iu]
    assert abs(spearman(naive, d[1]) - spearman(d[0], d[1])) > 1e-7  # (ranks move; the product is held to 1e-9 above)


@pytest.mark.parametrize("kind", ["correlation", "euclidean"])
def test_rsa_equals_spearman_of_dissimilarities(kind: str) -> None:
    series = data(25, seed=3)
    got = run("gram", series, 6, measure="rsa", dissimilarity=kind)
    iu = np.triu_indices(25, k=1)
    want = np.array([[spearman(dissim(flat(x), kind)[iu], dissim(flat(y), kind)[iu]) for y in series]
                     for x in series])
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("batch", [4, 9])
def test_minibatch_is_the_mean_unbiased_hsic_of_the_full_batches(batch: int) -> None:
    series = data(40, seed=4)  # 40 rows: batches of 9 leave a last batch of 4 out
    got = run("minibatch", series, batch)
    full = [slice(s, s + batch) for s in range(0, 40 - batch + 1, batch)]

    def mean_hsic(x: np.ndarray, y: np.ndarray) -> float:
        return np.mean([unbiased(flat(x[b]) @ flat(x[b]).T, flat(y[b]) @ flat(y[b]).T) for b in full])

    want = np.array([[mean_hsic(x, y) / np.sqrt(mean_hsic(x, x) * mean_hsic(y, y)) for y in series]
                     for x in series])
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize(("route", "measure"), [("gram", "linear_cka"), ("gram", "rbf_cka"), ("feature", "linear_cka")])
@pytest.mark.parametrize("batch", [3, 40])
def test_unbiased_is_songs_unbiased_hsic_over_every_row(route: str, measure: str, batch: int) -> None:
    """Both routes: the gram route U-centres the Gram matrices; the feature route (features fewer than
    the rows) builds the same terms from sums over the rows, the data's offset of 3 included."""
    series = data(40, seed=5)
    got = run(route, series, batch, measure=measure, unbiased=True)
    kernel = (lambda x: gram_rbf(flat(x), 0.8)) if measure == "rbf_cka" else (lambda x: flat(x) @ flat(x).T)
    k = [kernel(x) for x in series]
    want = np.array([[unbiased(a, b) / np.sqrt(unbiased(a, a) * unbiased(b, b)) for b in k] for a in k])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    biased = np.array([[cka(a, b) for b in k] for a in k])
    assert np.abs(want - biased).max() > 1e-3  # (the estimators differ on these rows: the test can fail)


def test_routes_by_size_and_the_refusal() -> None:
    assert choose_route("linear_cka", "exact", [10, 20], rows=1000, batch=10, memory=1 << 30) == "feature"
    assert choose_route("linear_cka", "exact", [10**5, 10**5], rows=100, batch=10, memory=1 << 30) == "gram"
    assert choose_route("rbf_cka", "exact", [10, 20], rows=1000, batch=10, memory=1 << 30) == "gram"
    with pytest.raises(ConfigError, match="estimator: minibatch"):
        choose_route("linear_cka", "exact", [10**5, 10**5], rows=10**5, batch=10, memory=1 << 30)
    assert choose_route("linear_cka", "unbiased", [10, 20], rows=1000, batch=10, memory=1 << 30) == "feature"
    assert choose_route("linear_cka", "unbiased", [10, 20], rows=None, batch=10, memory=1 << 30) == "feature"
    assert choose_route("linear_cka", "unbiased", [10**5, 10**5], rows=100, batch=10, memory=1 << 30) == "gram"
    with pytest.raises(ConfigError) as e:
        choose_route("rbf_cka", "unbiased", [10, 20], rows=None, batch=10, memory=1 << 30)
    assert str(e.value) == ("similarity.measure=rbf_cka over an unsized data set: it needs every item's Gram row, "
                            "sized before the pass; give the data a length (or data.limit), or use fewer items, or "
                            "linear_cka with estimator: minibatch")


@pytest.mark.parametrize("measure", ["linear_cka", "rbf_cka", "rsa"])
def test_the_gram_routes_peak_is_within_the_bytes_it_is_chosen_by(monkeypatch, measure: str) -> None:
    """What numpy allocates while the gram route makes its matrix (tracemalloc sees every numpy array)
    stays within route_bytes, the figure `memory` is held against: a bound that counted only the
    Gram matrices kept let a run that fit `memory` use twice it after the whole pass. The slab is
    made small here, so that n^2 and not the slab decides the peak."""
    import tracemalloc

    from hookrun.runner.kinds.similarity import accumulate, gram

    monkeypatch.setattr(gram, "SLAB", 1 << 16)
    n, dims = 400, [12, 30, 7, 20]
    g = np.random.default_rng(5)
    series = [g.normal(size=(n, d)).astype(np.float32) for d in dims]
    run("gram", [x[:10] for x in series], 10, measure=measure)  # (numpy's first calls import modules: not counted)
    acc = accumulator("gram", pairs_of(len(dims), None), measure=measure, batch=50)
    for s in range(0, n, 50):
        acc.add([torch.from_numpy(x[s:s + 50]) for x in series])
    tracemalloc.start()
    try:
        got = acc.matrix((4, 4))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        acc.close()
    bound = accumulate.route_bytes("gram", dims, n, 50, measure)
    assert 0.7 * bound < peak <= bound, (peak / (8 * n * n), bound / (8 * n * n))
    if measure == "rsa":  # (and still the definition: scipy's Spearman of the correlation distances)
        iu = np.triu_indices(n, k=1)
        want = spearman(dissim(flat(series[0]), "correlation")[iu], dissim(flat(series[3]), "correlation")[iu])
        assert got[0, 3] == pytest.approx(want, rel=1e-6)


def test_rsa_by_correlation_keeps_the_ties_of_equal_items() -> None:
    """Items given twice: their correlation distance came out +-1e-16, not 0, and split the ties that
    scipy ranks as one (here 0.760257 for 0.760275). Reference: scipy's Spearman of the exact dissimilarities
    (numpy's on the distinct items, each pair of equal items 0, every tie exact by construction)."""
    scipy_stats = pytest.importorskip("scipy.stats")
    g = np.random.default_rng(3)
    a = g.normal(size=(20, 7)).astype(np.float32)
    b = np.maximum(a @ g.normal(size=(7, 9)), 0).astype(np.float32) + 0.1 * g.normal(size=(20, 9)).astype(np.float32)
    twice = np.repeat(np.arange(20), 2)
    got = run("gram", [a[twice], b[twice]], 7, measure="rsa", dissimilarity="correlation")
    iu = np.triu_indices(40, k=1)
    exact = [dissim(x.astype(np.float64), "correlation")[np.ix_(twice, twice)] for x in (a, b)]
    for d in exact:
        d[twice[:, None] == twice[None, :]] = 0.0
    assert got[0, 1] == pytest.approx(scipy_stats.spearmanr(exact[0][iu], exact[1][iu]).statistic, abs=1e-12)



@pytest.mark.parametrize("kind", ["correlation", "euclidean"])
def test_rsa_ties_the_distances_of_an_equal_item_to_every_other_item(kind: str) -> None:
    """Items given twice, apart (12 items, then the first 8 again): an item's equal twin is exactly as far from
    every other item, which scipy's pdist gives to the bit and spearmanr ranks as ties. From the Gram matrix
    some of those distances came out a float64 step apart (another row's products summed in another order)
    and were ranked apart: up to 7.1e-5 off with euclidean, 2.8e-5 with correlation, over these seeds.
    Reference: scipy's Spearman of pdist's distances, each pair of equal items 0 (pdist's +-1e-16 for equal
    items' correlation is rounding: the ties test above)."""
    scipy_stats = pytest.importorskip("scipy.stats")
    from scipy.spatial.distance import pdist

    twice = np.r_[np.arange(12), np.arange(8)]
    for seed in range(10):
        g = np.random.default_rng(seed)
        for width in (5, 7):
            a = g.normal(size=(12, width)).astype(np.float32)
            b = np.tanh(a @ g.normal(size=(width, 9))).astype(np.float32)
            got = run("gram", [a[twice], b[twice]], 5, measure="rsa", dissimilarity=kind)
            exact = [pdist(x[twice].astype(np.float64), kind) for x in (a, b)]
            equal = pdist(twice[:, None].astype(np.float64), "cityblock") == 0  # (the pairs of an item and its twin)
            for d in exact:
                d[equal] = 0.0
            want = scipy_stats.spearmanr(*exact).statistic
            assert got[0, 1] == pytest.approx(want, abs=1e-12), (seed, width)


def test_rsa_by_correlation_keeps_the_ties_of_opposite_items() -> None:
    """A layer of two features (a binary head's logits): any two items' Pearson correlation is exactly +1 or
    -1, their correlation distance 0 or 2. The distance 2 came out 2 - 2e-16 for some pairs, and ranking split
    that tie (0.31449 where the exact ties give 0.31785). Reference: scipy's Spearman of the exact distances,
    1 - sign((a1 - a2)(b1 - b2)) for items (a1, a2) and (b1, b2) of two features."""
    scipy_stats = pytest.importorskip("scipy.stats")
    g = np.random.default_rng(5)
    x = g.normal(size=(37, 6)).astype(np.float32)
    head = (np.tanh(x) @ g.normal(size=(6, 2))).astype(np.float32)
    got = run("gram", [x, head], 8, measure="rsa", dissimilarity="correlation")
    iu = np.triu_indices(37, k=1)
    d = head[:, 0].astype(np.float64) - head[:, 1]
    exact = 1.0 - np.sign(d[:, None] * d[None, :])
    assert set(np.unique(exact[iu])) == {0.0, 2.0}
    want = scipy_stats.spearmanr(dissim(x.astype(np.float64), "correlation")[iu], exact[iu]).statistic
    assert got[0, 1] == pytest.approx(want, abs=1e-12)

@pytest.mark.parametrize("measure", ["linear_cka", "rsa"])
def test_a_series_that_varies_only_past_the_lead_columns_is_not_constant(monkeypatch, measure: str) -> None:
    """The gram route tests a slab's first LEAD columns for a constant series before the rest: a series whose
    only varying column is the 90th (the first slab's lead all constant) and one whose only varying column is
    in a later slab are still compared (their cells numbers), a series constant throughout is NaN."""
    from hookrun.runner.kinds.similarity import gram

    monkeypatch.setattr(gram, "SLAB", 30 * 8 * 100)  # (slabs of 100 columns)
    g = np.random.default_rng(12)
    late, later, flat_ = (np.full((30, 250), 2.5, np.float32) for _ in range(3))
    late[:, 90], later[:, 230] = g.normal(size=30), g.normal(size=30)
    got = run("gram", [late, later, flat_], 10, measure=measure)
    assert np.isfinite(got[:2, :2]).all() and np.isnan(got[2]).all() and np.isnan(got[:, 2]).all()
