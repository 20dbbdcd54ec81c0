"""The gram route of a similarity run: every series' rows (held, else spooled: rows.py), at the end each
series' n x n Gram matrix, made into what its measure needs, then every pair as one dot product.

    route = GramRoute(pairs, measure="linear_cka", sigma=0.8, dissimilarity="correlation", held=bytes)
    route.add([each series' (batch rows, features) tensor]); ...; route.matrix((rows, cols))
    gram_bytes(dims, rows, measure)   # its peak, the figure `similarity.memory` is held against
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hookrun.runner.kinds.similarity import measures as m
from hookrun.runner.kinds.similarity.rows import SeriesRows

SLAB = 16 << 20  # bytes of rows read at once when the spooled features become Gram matrices
LEAD = 64  # a slab's columns tested first for a constant series: one that varies among them answers for the slab
# Linear CKA's Gram matrix of float32 rows, from FAST_ROWS items: each slab's columns centred, multiplied in float32,
# the slabs' products summed in float64, a slab's WIDE columns (sum of squares over 16 times the median column's:
# outlier features) multiplied in float64 apart. A quarter of the float64 products' time (0.027 against 0.109 s
# for 512 x 16384 rows here) within 1e-7 of each CKA (tests/similarity/test_similarity_gram_precision.py):
# uncentred, column scales spread over four orders of magnitude lost 2e-6 of a CKA of 0.004; without the wide
# columns apart, three features 1000 times the rest lost 2.2e-6 of a CKA of 0.026.
FAST_ROWS = 256
WIDE = 16.0


def gram_bytes(dims: list[int], rows: int, measure: str) -> int:
    """The route's peak bytes: its n x n matrices (kept and at work) and a slab of rows read back."""
    n2, slab = rows**2, min(SLAB, 8 * rows * max(dims, default=0))
    return (4 * (len(dims) + 4) * n2 if measure == "rsa" else 8 * (len(dims) + 1) * n2) + slab + slab // 4


def slab_within_noise(part: np.ndarray, n: int, first: np.ndarray) -> bool:
    """measures.within_noise over a slab's columns (rows less `first`, a value per column): the same answer
    from its first LEAD columns where one of them varies (every column must be within noise), read whole
    only where none does (a varying series: 64 columns, not 4,096: about 8 ms less on one core for the
    benchmark's four stages of 512 rows)."""
    for cols in (slice(0, LEAD), slice(None)):
        p = part[:, cols].astype(np.float64, copy=False)
        if not m.within_noise(p.sum(axis=0), np.einsum("ij,ij->j", p, p), n, first[cols]):
            return False
    return True


class GramRoute:
    """Every series' rows held within `held` bytes, beyond them spooled to files in the kind's scratch
    folder (rows.py); at the end its Gram matrix, then the measure."""

    def __init__(self, pairs: list[tuple[int, int]], measure: str, sigma: float, dissimilarity: str,
                 held: int = 0, unbiased: bool = False) -> None:
        self.pairs, self.measure, self.sigma, self.dissimilarity = pairs, measure, sigma, dissimilarity
        self.unbiased = unbiased  # CKA from Song et al.'s unbiased HSIC over every row (U-centred Gram matrices)
        self.rows = SeriesRows(held)
        self.constant: list[bool] = []  # per series, set by matrix()
        self.flat_items: list[bool] = []  # per series (RSA, correlation): an item whose features are all equal
        self.no_median: list[bool] = []  # per series (rbf CKA): the median squared distance 0, the kernel's width 0

    def add(self, series: list[torch.Tensor]) -> None:
        self.rows.add(series)

    def save(self, path: Path) -> None:
        self.rows.save(path)

    def merge(self, path: Path) -> None:
        self.rows.merge(path)

    def gram(self, k: int) -> tuple[np.ndarray, np.ndarray, bool, bool, list[int] | None]:
        """Series k's Gram matrix and (RSA's correlation) row sums, from its rows in slabs of columns (float64); whether
        every row is the first (a constant series); and whether some item's features are all equal (RSA's
        correlation is undefined for it). CKA's rows, and RSA's for Euclidean distances, are less their first
        row: the same centred matrix (HKH; distances and the U-centring do not move with a shift either),
        without a feature's offset cancelling against itself in the products (an offset of 1000 over a
        spread of 0.01 lost 4e-5 of a CKA so). RSA's correlation takes each item less its own mean (a
        Pearson correlation does not move with it; an item's offset would cancel in G - s s^T / D): a
        first pass reads the means and the flags, the second the products (and the sums left, near 0).
        RSA's last element is each item's key, equal for items whose features are equal (measures.tie_equal_items_)."""
        if self.measure == "linear_cka" and self.rows.n >= FAST_ROWS and self.rows.dtypes[k] == np.float32:
            return self.mixed_gram(k)
        n, step = self.rows.n, max(1, SLAB // (8 * self.rows.n))
        g = np.zeros((n, n))
        keys = [0] * n if self.measure == "rsa" else None
        if self.measure != "rsa" or self.dissimilarity == "euclidean":
            same, first, c = True, self.rows.first(k), 0
            for part in self.rows.slabs(k, step, shift=first):
                g += part @ part.T
                w = part.shape[1]  # (constant up to rounding: measures.NOISE)
                same = same and slab_within_noise(part, n, first[c:c + w])
                keys = m.row_keys(part, keys)
                c += w
            return g, np.zeros(n), same, False, keys
        sums, same, lead, flat = np.zeros(n), True, None, np.ones(n, bool)
        for part in self.rows.slabs(k, step):  # (a first pass: each item's mean and the flags)
            keys = m.row_keys(part, keys)
            sums += part.sum(axis=1)
            same = same and slab_within_noise(part, n, np.zeros(part.shape[1]))
            if lead is None:  # (each item's first feature: the first slab's first column)
                lead = part[:, 0].copy()
            if flat.any():
                flat &= (part == lead[:, None]).all(axis=1)
        mean, sums = sums / self.rows.dims[k], np.zeros(n)
        for part in self.rows.slabs(k, step, shift=mean, per_row=True):  # (each item less its own mean)
            g += part @ part.T
            sums += part.sum(axis=1)
        return g, sums, same, bool(flat.any()), keys

    def mixed_gram(self, k: int) -> tuple[np.ndarray, np.ndarray, bool, bool, None]:
        """gram() for linear CKA of float32 rows (see FAST_ROWS): the rows less the first, in float32 (exact
        where they are near it: a feature's offset does not round its spread away), multiplied in float32,
        each slab's product added in float64; a slab's wide columns multiplied in float64 on their own."""
        n, step = self.rows.n, max(1, SLAB // (4 * self.rows.n))
        g, first, same, c = np.zeros((n, n)), self.rows.first(k), True, 0
        for part in self.rows.slabs(k, step, shift=first.astype(np.float32), dtype=np.float32):
            w = part.shape[1]
            same = same and slab_within_noise(part, n, first[c:c + w])
            part -= np.mean(part, axis=0, dtype=np.float64).astype(np.float32)  # (centred: no mean's square to round)
            squares = np.einsum("ij,ij->j", part, part)
            wide = squares > WIDE * np.median(squares[squares > 0]) if squares.any() else None
            if wide is not None and wide.any():  # (16 parts of a slab at a time: the slab's quarter route_bytes counts)
                idx = np.flatnonzero(wide)
                for j in range(0, len(idx), max(1, w // 16)):
                    cols = part[:, idx[j:j + max(1, w // 16)]].astype(np.float64)
                    g += cols @ cols.T
                part[:, wide] = 0.0  # (the slab's buffer is not read again)
            g += part @ part.T
            c += w
        return g, np.zeros(n), same, False, None

    def matrix(self, shape: tuple[int, int]) -> np.ndarray:
        """Each series' Gram matrix once, made in place into what its pairs need (centred and of unit
        norm for CKA; the ranks of its dissimilarities for RSA), then every pair as a dot product;
        NaN where a series is constant (the measure is 0 / 0; rounding would make it any number)."""
        self.constant, self.flat_items, self.no_median = [], [], []  # (each series' flags, appended by prepared)
        prepared = [self.prepared(k) for k in range(len(self.rows.dims))]
        dots: dict[tuple[int, int], float] = {}  # (a pair and its mirror: one dot product, the same to the bit)
        for i, j in self.pairs:
            if (key := (min(i, j), max(i, j))) not in dots:
                dots[key] = np.vdot(prepared[i], prepared[j])
        out = np.array([dots[min(i, j), max(i, j)] for i, j in self.pairs])
        gone = [c or f or z for c, f, z in zip(self.constant, self.flat_items, self.no_median, strict=True)]
        return m.undefined(out, self.pairs, gone).reshape(shape)

    def prepared(self, k: int) -> np.ndarray:
        """Series k's Gram matrix made in place into what its pairs need (one n x n matrix at work)."""
        g, sums, same, flat, keys = self.gram(k)
        self.constant.append(same)
        self.flat_items.append(flat and self.measure == "rsa" and self.dissimilarity == "correlation" and not same)
        if self.measure == "rbf_cka":
            g = m.rbf_(g, self.sigma)
        self.no_median.append(self.measure == "rbf_cka" and not same and not g.any())  # (rbf_'s 0 matrix)
        if self.measure != "rsa":
            return m.unit(m.u_center_(g) if self.unbiased else m.center_(g))
        d = m.tie_equal_items_(m.dissimilarity_(g, sums, self.rows.dims[k], self.dissimilarity), keys)
        values = m.upper_triangle(d)
        del g, d  # (half the numbers from here on)
        return m.ranks_(values)

    def close(self) -> None:
        self.rows.close()
