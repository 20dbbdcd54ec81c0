"""The similarity measures, from Gram matrices (numpy, float64): the definitions the kind computes.

    K, L = x @ x.T, y @ y.T
    linear_cka(K, L)                  # Kornblith et al. 2019: <HKH, HLH> / (|HKH| |HLH|)
    linear_cka(rbf_gram(K, 0.8), rbf_gram(L, 0.8))    # rbf_cka
    rsa(dissimilarity(K, sums_x, d_x), dissimilarity(L, sums_y, d_y))
    unbiased_hsic(K, L)               # Song et al. 2012, the minibatch estimator's term

Every measure takes Gram matrices (rows by rows), so the exact run needs only the Gram matrices
(sample-space route) or, for linear CKA, the centred cross-covariances (`cka_from_covariances`).
"""

from __future__ import annotations

import numpy as np

MEASURES = ("linear_cka", "rbf_cka", "rsa")
DISSIMILARITIES = ("correlation", "euclidean")


def center(gram: np.ndarray) -> np.ndarray:
    """H K H, H = I - 11^T/n: the Gram matrix of the column-centred rows."""
    g = gram - gram.mean(axis=0, keepdims=True)
    return g - g.mean(axis=1, keepdims=True)


def linear_cka(gram_x: np.ndarray, gram_y: np.ndarray) -> float:
    """CKA in the HSIC form: <HKH, HLH>_F / (|HKH|_F |HLH|_F) (linear CKA where K = XX^T, L = YY^T)."""
    kc, lc = center(gram_x), center(gram_y)
    return float(np.vdot(kc, lc) / (np.linalg.norm(kc) * np.linalg.norm(lc)))


def cka_from_covariances(cxy: np.ndarray, cxx: np.ndarray, cyy: np.ndarray) -> float:
    """Linear CKA from centred cross-covariances: |Xc^T Yc|^2 / (|Xc^T Xc| |Yc^T Yc|) (all Frobenius)."""
    return float(np.vdot(cxy, cxy) / (np.linalg.norm(cxx) * np.linalg.norm(cyy)))


def squared_distances(gram: np.ndarray) -> np.ndarray:
    """|x_a - x_b|^2 from the Gram matrix (clipped at 0 against rounding)."""
    sq = np.diag(gram)
    return np.maximum(sq[:, None] + sq[None, :] - 2 * gram, 0.0)


def rbf_gram(gram: np.ndarray, sigma: float) -> np.ndarray:
    """Kornblith et al.'s gram_rbf: exp(-d^2 / (2 sigma^2 median(d^2))), the zero diagonal in the median."""
    d2 = squared_distances(gram)
    return np.exp(-d2 / (2 * sigma**2 * np.median(d2)))


def dissimilarity(gram: np.ndarray, sums: np.ndarray, features: int, kind: str) -> np.ndarray:
    """The rows' dissimilarity matrix: 1 - Pearson correlation across features, or Euclidean distance."""
    if kind == "euclidean":
        return np.sqrt(squared_distances(gram))
    cov = gram - np.outer(sums, sums) / features  # the rows' products after each row loses its own mean
    sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 - cov / np.outer(sd, sd)


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their mean rank (scipy.stats.rankdata's 'average')."""
    order = np.argsort(values, kind="mergesort")
    sorted_v = values[order]
    starts = np.r_[True, sorted_v[1:] != sorted_v[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    counts = np.diff(np.r_[first, len(values)])
    mean_rank = first + (counts + 1) / 2.0
    out = np.empty(len(values))
    out[order] = mean_rank[group]
    return out


def rsa(dis_x: np.ndarray, dis_y: np.ndarray) -> float:
    """Spearman correlation of the two dissimilarity matrices' upper triangles (diagonal left out)."""
    iu = np.triu_indices(dis_x.shape[0], k=1)
    rx, ry = ranks(dis_x[iu]), ranks(dis_y[iu])
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float(rx @ ry / np.sqrt((rx @ rx) * (ry @ ry)))


def unbiased_hsic(gram_x: np.ndarray, gram_y: np.ndarray) -> float:
    """Song et al. 2012's unbiased HSIC (Nguyen, Raghu & Kornblith 2021's minibatch term); n >= 4.

    With K~, L~ the Gram matrices with zero diagonals:
    [tr(K~L~) + 1^T K~ 1 1^T L~ 1 / ((n-1)(n-2)) - 2/(n-2) 1^T K~ L~ 1] / (n(n-3)).
    """
    n = gram_x.shape[0]
    k, l_ = gram_x.copy(), gram_y.copy()
    np.fill_diagonal(k, 0.0)
    np.fill_diagonal(l_, 0.0)
    rk, rl = k.sum(axis=1), l_.sum(axis=1)
    value = np.vdot(k, l_) + rk.sum() * rl.sum() / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * (rk @ rl)
    return float(value / (n * (n - 3)))
