"""The similarity measures, from Gram matrices (numpy, float64): the definitions the kind computes.

Each series' Gram matrix `K = X X^T` is turned, in place, into what its pairs need, once:

    unit(center_(K))                        # linear CKA: <HKH, HLH> / (|HKH| |HLH|) is then a dot product
    unit(u_center_(K))                      # estimator unbiased: Song et al.'s unbiased HSIC, likewise
    unit(center_(rbf_(K, 0.8)))             # rbf CKA: Kornblith et al.'s gram_rbf, then the same
    ranks_(upper_triangle(dissimilarity_(K, row_sums, features, "correlation")))   # RSA: Spearman, a dot product

and `cka_from_covariances` gives linear CKA from the centred cross-covariances (the feature route).
In place: the gram route's memory bound (accumulate.route_bytes) counts one n x n matrix at work.
"""

from __future__ import annotations

import numpy as np

MEASURES = ("linear_cka", "rbf_cka", "rsa")
DISSIMILARITIES = ("correlation", "euclidean")
ROWS = 1 << 21  # numbers per block of rows where a step would otherwise make an n x n temporary


def _blocks(n: int) -> list[slice]:
    step = max(1, ROWS // max(n, 1))
    return [slice(r, r + step) for r in range(0, n, step)]


def center_(g: np.ndarray) -> np.ndarray:
    """H K H, H = I - 11^T/n, in place: the Gram matrix of the column-centred rows."""
    g -= g.mean(axis=0, keepdims=True)
    g -= g.mean(axis=1, keepdims=True)
    return g


def u_center_(g: np.ndarray) -> np.ndarray:
    """K's U-centring in place (Szekely & Rizzo 2014): with K~ = K less its diagonal and r its row sums,
    K~_ij - r_i/(n-2) - r_j/(n-2) + sum(r)/((n-1)(n-2)) off the diagonal, 0 on it. The dot product of
    two such matrices over n (n - 3) is Song et al. 2012's unbiased HSIC of K and L (n >= 4)."""
    n = len(g)
    np.fill_diagonal(g, 0.0)
    r = g.sum(axis=1)
    total = r.sum()
    r /= n - 2
    g -= r[:, None]
    g -= r[None, :]
    g += total / ((n - 1) * (n - 2))
    np.fill_diagonal(g, 0.0)
    return g


def unit(g: np.ndarray) -> np.ndarray:
    """g / |g|_F in place (a zero matrix stays zero: its series is constant, its cells NaN)."""
    norm = np.linalg.norm(g)
    if norm:
        g /= norm
    return g


def cka_from_covariances(cxy: np.ndarray, nx: float, ny: float) -> float:
    """Linear CKA from centred cross-covariances: |Xc^T Yc|^2 / (|Xc^T Xc| |Yc^T Yc|) (all Frobenius;
    nx, ny the last two, and cxy a view: einsum reads it without a copy)."""
    return float(np.einsum("ij,ij->", cxy, cxy) / (nx * ny))


def squared_distances_(g: np.ndarray) -> np.ndarray:
    """|x_a - x_b|^2 from the Gram matrix, in place (clipped at 0 against rounding)."""
    sq = np.diag(g).copy()
    g *= -2.0
    g += sq[:, None]
    g += sq[None, :]
    return np.maximum(g, 0.0, out=g)


def rbf_(g: np.ndarray, sigma: float) -> np.ndarray:
    """Kornblith et al.'s gram_rbf in place: exp(-d^2 / (2 sigma^2 median(d^2))), the zero diagonal in the median."""
    d2 = squared_distances_(g)
    d2 /= -2 * sigma**2 * np.median(d2)
    return np.exp(d2, out=d2)


def dissimilarity_(g: np.ndarray, sums: np.ndarray, features: int, kind: str) -> np.ndarray:
    """The rows' dissimilarity matrix in place: 1 - Pearson correlation across features, or Euclidean distance."""
    if kind == "euclidean":
        return np.sqrt(squared_distances_(g), out=g)
    mean = sums / features
    for b in _blocks(len(g)):  # the rows' products after each row loses its own mean
        g[b] -= np.outer(sums[b], mean)
    sd = np.sqrt(np.maximum(np.diag(g), 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        for b in _blocks(len(g)):
            g[b] /= np.outer(sd[b], sd)
    return np.subtract(1.0, g, out=g)


def upper_triangle(g: np.ndarray) -> np.ndarray:
    """The values above the diagonal, row by row (n (n - 1) / 2 of them)."""
    return np.concatenate([g[i, i + 1:] for i in range(len(g))]) if len(g) > 1 else np.zeros(0)


def ranks_(values: np.ndarray) -> np.ndarray:
    """Ranks from 1 in place of the values, ties given their mean rank (scipy.stats.rankdata's
    'average'), then centred and of unit norm: Spearman's correlation of two sets of values is then the
    dot product of theirs. At most three more arrays of the values' length at once."""
    order = np.argsort(values, kind="mergesort")
    values[:] = values[order]  # sorted, in the same buffer
    starts = np.empty(len(values), dtype=bool)
    starts[:1] = True
    np.not_equal(values[1:], values[:-1], out=starts[1:])
    first = np.flatnonzero(starts)  # each run of equal values is ranks first + 1 .. next first
    mean_rank = np.empty(len(first))
    mean_rank[:-1] = first[1:]
    mean_rank[-1:] = len(values)
    mean_rank += first
    mean_rank += 1.0
    mean_rank /= 2.0
    del first
    group = starts.astype(np.int64)
    np.cumsum(group, out=group)  # (in place: cumsum of the booleans themselves makes a second array)
    group -= 1
    del starts
    np.take(mean_rank, group, out=values, mode="wrap")  # the sorted values' ranks (mode: no buffer)
    del group, mean_rank
    ranked = np.empty_like(values)
    ranked[order] = values
    values[:] = ranked
    del ranked, order
    if len(values):
        values -= values.mean()
    return unit(values)
