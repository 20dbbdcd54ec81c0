"""The similarity measures, from Gram matrices (numpy, float64): the definitions the kind computes.

Each series' Gram matrix `K = X X^T` is turned, in place, into what its pairs need, once:

    unit(center_(K))                        # linear CKA: <HKH, HLH> / (|HKH| |HLH|) is then a dot product
    unit(u_center_(K))                      # estimator unbiased: Song et al.'s unbiased HSIC, likewise
    unit(center_(rbf_(K, 0.8)))             # rbf CKA: Kornblith et al.'s gram_rbf, then the same
    ranks_(upper_triangle(dissimilarity_(K, row_sums, features, "correlation")))   # RSA: Spearman, a dot product

and `cka_from_covariances` gives linear CKA from the centred cross-covariances (the feature route),
`unbiased_hsics` the unbiased HSIC from the same route's uncentred sums.
In place: the gram route's memory bound (accumulate.route_bytes) counts one n x n matrix at work.
"""

from __future__ import annotations

import numpy as np

MEASURES = ("linear_cka", "rbf_cka", "rsa")
DISSIMILARITIES = ("correlation", "euclidean")
ROWS = 1 << 21  # numbers per block of rows where a step would otherwise make an n x n temporary
TIE = 4 * np.finfo(np.float64).eps  # 1 - r within 4 float64 steps of 0: rounding, not a distance (rsa's correlation)


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


def unbiased_hsics(zz: np.ndarray, sums: np.ndarray, zq: np.ndarray, qq: np.ndarray, qsum: np.ndarray, n: int,
                   block: list[slice], pairs: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
    """Song et al. 2012's unbiased HSIC of the linear kernels of series i and j, for every pair and every
    series with itself, from sums over the rows z (any shift: the estimator is unchanged by one): zz = sum
    z z^T, sums = sum z, q_i = each row's squared norm in series i, qq = sum q q^T, qsum = sum q, zq = sum z q^T.
    With K~ the Gram matrix less its diagonal, its terms are
    tr(K~ L~) = |Z_i^T Z_j|^2 - sum q_i q_j,  1^T K~ 1 = |s_i|^2 - sum q_i,
    1^T K~ L~ 1 = s_i^T Z_i^T Z_j s_j - s_i . Z_i^T q_j - s_j . Z_j^T q_i + sum q_i q_j."""
    def hsic(i: int, j: int) -> float:
        bi, bj = block[i], block[j]
        c, si, sj = zz[bi, bj], sums[bi], sums[bj]
        trace = np.einsum("ij,ij->", c, c) - qq[i, j]
        ki, kj = si @ si - qsum[i], sj @ sj - qsum[j]
        rows = si @ c @ sj - si @ zq[bi, j] - sj @ zq[bj, i] + qq[i, j]
        return float((trace + ki * kj / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * rows) / (n * (n - 3)))
    wanted = {*pairs, *((i, i) for i in range(len(block)))}
    return {(i, j): hsic(i, j) for i, j in sorted(wanted)}


def moved(qq: np.ndarray, qsum: np.ndarray, zq: np.ndarray, zz: np.ndarray, sums: np.ndarray, n: int, d: np.ndarray,
          block: list[slice]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Another rank's unbiased sums (over rows z, about its shift) moved to rows z + d (this rank's shift):
    with a_i = z_i . d_i and c_i = |d_i|^2 per series i, each q_i becomes q_i + 2 a_i + c_i, so
    sum q'q'^T = qq + 2 (M + M^T) + 4 P + qsum c^T + c qsum^T + 2 (sa c^T + c sa^T) + n c c^T,
    sum q' = qsum + 2 sa + n c,  Z'^T q' = zq + 2 A + sums c^T + d qsum^T + 2 d sa^T + n d c^T,
    where A = Z^T a, sa = sum a, M = sum q a^T, P = sum a a^T (each from zz, sums, zq)."""
    c = np.array([d[b] @ d[b] for b in block])
    sa = np.array([sums[b] @ d[b] for b in block])
    a = np.stack([zz[:, b] @ d[b] for b in block], axis=1)
    mm = np.stack([zq[b].T @ d[b] for b in block], axis=1)  # M[i, j] = sum q_i a_j
    p = np.array([[a[bi, j] @ d[bi] for j in range(len(block))] for bi in block])
    qq = (qq + 2 * (mm + mm.T) + 4 * p + np.outer(qsum, c) + np.outer(c, qsum) + 2 * (np.outer(sa, c) + np.outer(c, sa))
          + n * np.outer(c, c))
    zq = zq + 2 * a + np.outer(sums, c) + np.outer(d, qsum) + 2 * np.outer(d, sa) + n * np.outer(d, c)
    return qq, qsum + 2 * sa + n * c, zq


def squared_distances_(g: np.ndarray) -> np.ndarray:
    """|x_a - x_b|^2 from the Gram matrix, in place (clipped at 0 against rounding)."""
    sq = np.diag(g).copy()
    g *= -2.0
    g += sq[:, None]
    g += sq[None, :]
    return np.maximum(g, 0.0, out=g)


def rbf_(g: np.ndarray, sigma: float) -> np.ndarray:
    """Kornblith et al.'s gram_rbf in place: exp(-d^2 / (2 sigma^2 median(d^2))), the zero diagonal in the median.
    A median of 0 (most pairs of rows equal: a width of 0) leaves it undefined: a zero matrix then (a kernel has
    1 on its diagonal), which the caller marks NaN (0 / 0 and x / 0 made NaN and 0 here)."""
    d2 = squared_distances_(g)
    median = np.median(d2)
    if not median:
        d2.fill(0.0)
        return d2
    d2 /= -2.0 * np.float64(sigma) ** 2 * median  # (float64: a Python float's ** raises OverflowError)
    return np.exp(d2, out=d2)


def dissimilarity_(g: np.ndarray, sums: np.ndarray, features: int, kind: str) -> np.ndarray:
    """The rows' dissimilarity matrix in place: 1 - Pearson correlation across features, or Euclidean distance.
    A correlation within TIE of 1 is 1 (the dissimilarity 0), and within TIE of -1 is -1 (the dissimilarity 2):
    equal (or opposite) items' correlation comes out +-1 +- a float64 step, which would split their ties (0
    against 0, 2 against 2: every pair of a two-feature layer) into ranks of rounding noise."""
    if kind == "euclidean":
        return np.sqrt(squared_distances_(g), out=g)
    mean = sums / features
    for b in _blocks(len(g)):  # the rows' products after each row loses its own mean
        g[b] -= np.outer(sums[b], mean)
    sd = np.sqrt(np.maximum(np.diag(g), 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        for b in _blocks(len(g)):
            g[b] /= np.outer(sd[b], sd)
            np.subtract(1.0, g[b], out=g[b])
            near = np.abs(g[b])  # (one block's buffer, reused for both ties)
            g[b][near <= TIE] = 0.0
            np.abs(np.subtract(g[b], 2.0, out=near), out=near)
            g[b][near <= TIE] = 2.0
    return g


def row_keys(part: np.ndarray, keys: list[int] | None) -> list[int] | None:
    """Each row's key, with a slab of its columns hashed in (-0.0 read as 0.0, in place): rows whose features are
    equal keep equal keys (tie_equal_items_). None (not RSA) stays None."""
    if keys is None:
        return None
    np.add(part, 0.0, out=part)
    return [hash((key, row.tobytes())) for key, row in zip(keys, part, strict=True)]


def tie_equal_items_(d: np.ndarray, keys: list[int] | None) -> np.ndarray:
    """Items whose features are equal (the same key) as scipy's pdist gives them, in place: 0 apart, and every
    one of them exactly as far from each other item as the group's first is (a row, then its column). From the
    Gram matrix, another row's products are summed in another order, and `d` is not symmetric to the bit:
    those ties came out split by rounding, ranked apart (Spearman off by up to 7e-5 for 20 items, 8 of them twice)."""
    groups: dict[int, list[int]] = {}
    for i, key in enumerate(keys or ()):
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        if len(members) > 1:  # (group by group: a later group's column takes the row this one wrote)
            first, rest = members[0], members[1:]
            d[:, first] = d[first]
            d[rest] = d[first]
            d[:, rest] = d[first][:, None]
            d[np.ix_(members, members)] = 0.0
    return d


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


# A column is one value up to rounding where its spread about its mean is within NOISE of its sum of squares:
# float32 rounds a value to within 2^-24 (6e-8) of itself, and a value a layer sums in another order for another
# row lands a few such steps away (rows of one input repeated through nn.Linear: spread / squares up to 1.7e-14);
# 1e-13 = (3.2e-7)^2, under 3 float32 ulps. Features that vary by more are kept (1e5 + 0.01 noise in float32: 4e-13).
NOISE = 1e-13


def spread_and_squares(d_sum, d_sq, n: int, first):
    """Each column's spread about its mean and its sum of squares over `n` rows, from its rows less `first` (a
    value per column, or 0): their sums `d_sum` and sums of squares `d_sq` (numpy or torch)."""
    spread = d_sq - d_sum**2 / n
    return spread, spread + n * (first + d_sum / n) ** 2


def within_noise(d_sum, d_sq, n: int, first) -> bool:
    """Whether every column is one value up to rounding (spread_and_squares' arguments)."""
    spread, squares = spread_and_squares(d_sum, d_sq, n, first)
    return bool((spread <= NOISE * squares).all())


def undefined(out: np.ndarray, pairs: list[tuple[int, int]], constant: list[bool]) -> np.ndarray:
    """NaN in every cell with a constant series: the measure is 0 / 0 there, and rounding would make it
    any number (a route's `constant`, per series)."""
    out[[constant[i] or constant[j] for i, j in pairs]] = np.nan
    return out
