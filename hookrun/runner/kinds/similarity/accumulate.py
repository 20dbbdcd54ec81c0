"""The three accumulators of a similarity run, fed batch by batch, and the choice among them by size.

    acc = accumulator(route, measure="linear_cka", series=4, pairs=pairs_of(4, None))
    for batch in data: acc.add([pooled features of each series: (rows, features) tensors])
    acc.matrix()        # (rows, cols) float64, the measure for every pair

| route      | holds                                    | exact for                 | bytes at most     |
|------------|------------------------------------------|---------------------------|-------------------|
| feature    | sums of Z and Z^T Z, Z = every series'   | linear CKA, any rows;     | 8 D^2 (D features)|
|            | features side by side (float64); for the | unbiased HSIC: from the   |                   |
|            | unbiased HSIC also each row's squared    | sums (measures.py)        |                   |
|            | norms per series, their products, Z^T q  |                           |                   |
| gram       | each series' rows (held within what      | linear CKA, rbf CKA, RSA; | 8 (S+1) n^2; RSA  |
|            | memory leaves, else spooled: rows.py);   | unbiased HSIC: U-centred  | 4 (S+4) n^2; and  |
|            | at the end its n x n Gram matrix         |                           | the rows held     |
| minibatch  | unbiased HSIC of every pair, summed over | Nguyen et al. 2021        | 8 S b^2 (b batch) |
|            | the full batches                         |                           |                   |

The bytes are the peak, not only what is kept: the gram route keeps each series' centred Gram matrix
(RSA: the ranks of its dissimilarities' upper triangle, half as many numbers) and works on one more
n x n matrix (and its product, or its ranks) at a time; a test holds the peak numpy allocates to it.

Many ranks: each rank but 0 `save`s its accumulator (sums, or its rows) and rank 0 `merge`s
them in rank order, which is batch order.

A series is one hook point's pooled features (a model's `at`, then the second model's `with.at`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hookrun.errors import ConfigError
from hookrun.runner.kinds.similarity import measures as m
from hookrun.runner.kinds.similarity.gram import GramRoute, gram_bytes

ROUTES = ("feature", "gram", "minibatch")


def pairs_of(rows: int, cols: int | None) -> list[tuple[int, int]]:
    """The (row series, column series) of every cell: [at, with.at], or [at, at] where cols is None."""
    if cols is None:
        return [(i, j) for i in range(rows) for j in range(rows)]
    return [(i, rows + j) for i in range(rows) for j in range(cols)]


def route_bytes(route: str, dims: list[int], rows: int | None, batch: int, measure: str = "linear_cka",
                unbiased: bool = False) -> int:
    """The bytes a route holds at its peak: `dims` the series' feature counts, `rows` the data set's items."""
    if route == "feature":  # (Z^T Z, a batch's float64 rows, and for the unbiased estimator Z^T q)
        return 8 * sum(dims) ** 2 + 8 * batch * sum(dims) + (8 * sum(dims) * len(dims) if unbiased else 0)
    if route == "gram":
        return gram_bytes(dims, rows or 0, measure)
    return 8 * len(dims) * batch**2 + 8 * batch * sum(dims)


def choose_route(measure: str, estimator: str, dims: list[int], rows: int | None, batch: int,
                 memory: int) -> str:
    """The accumulator: minibatch where asked; else the cheaper exact route that fits `memory`
    (feature space where the features are fewer than the rows), or one ConfigError line."""
    if estimator == "minibatch":
        need = route_bytes("minibatch", dims, rows, batch)
        if need > memory:
            raise ConfigError(f"similarity.memory={_mb(memory)}: the minibatch estimator holds {_mb(need)} for "
                              f"batches of {batch}; raise memory or lower data.batch_size")
        return "minibatch"
    exact = ["gram"] if measure != "linear_cka" else ["feature", "gram"] \
        if rows is None or sum(dims) <= rows else ["gram", "feature"]
    if rows is None:
        exact = [r for r in exact if r == "feature"]
    for route in exact:
        if route_bytes(route, dims, rows, batch, measure, estimator == "unbiased") <= memory:
            return route
    hint = ("estimator: minibatch (unbiased HSIC over the batches)" if measure == "linear_cka"
            else "fewer items, or linear_cka with estimator: minibatch")
    if not exact:  # (rbf CKA, RSA: only the gram route, sized by the items before the pass)
        raise ConfigError(f"similarity.measure={measure} over an unsized data set: it needs every item's Gram row, "
                          f"sized before the pass; give the data a length (or data.limit), or use {hint}")
    need = min(route_bytes(r, dims, rows, batch, measure, estimator == "unbiased") for r in exact)
    raise ConfigError(f"similarity.memory={_mb(memory)}: {estimator} {measure} over {rows or 'an unsized set of'} items "
                      f"and {sum(dims)} features needs {_mb(need)}; raise memory or use {hint}")


def _mb(n: int) -> str:
    """Bytes as a config gives them: MB to one decimal, or the bytes themselves under a megabyte (1KB is
    not 0.0MB)."""
    return f"{n / 1e6:.1f}MB" if n >= 1e6 else f"{int(n)} bytes"


class FeatureRoute:
    """Exact linear CKA from the centred cross-covariances of every series, accumulated in float64; with
    `unbiased`, Song et al.'s unbiased HSIC from the same sums and three more (measures.unbiased_hsics)."""

    def __init__(self, pairs: list[tuple[int, int]], unbiased: bool = False) -> None:
        self.pairs, self.unbiased = pairs, unbiased
        self.n, self.shift, self.sums, self.zz = 0, None, None, None
        self.blocks: list[slice] = []  # each series' columns of Z, set by the first batch
        self.qq, self.qsum, self.zq = None, None, None  # unbiased: sum q q^T, sum q, Z^T q (q: rows' squared norms)
        self.constant: list[bool] = []  # per series, set by matrix(): its features the same for every item

    def add(self, series: list[torch.Tensor]) -> None:
        rows = len(series[0])
        if self.shift is None:
            o = np.cumsum([0] + [s[0].numel() for s in series]).tolist()
            self.blocks = [slice(a, b) for a, b in zip(o[:-1], o[1:], strict=True)]
        z = torch.empty(rows, self.blocks[-1].stop, dtype=torch.float64, device=series[0].device)
        for s, b in zip(series, self.blocks, strict=True):  # float64, one copy
            z[:, b].copy_(s.reshape(rows, -1))
        if self.shift is None:  # a shift by the first batch's mean keeps the centring exact in float64
            self.shift = z.mean(dim=0)
            self.sums = torch.zeros_like(self.shift)
            self.zz = torch.zeros(z.shape[1], z.shape[1], dtype=torch.float64, device=z.device)
            if self.unbiased:
                k = len(series)
                self.qq, self.qsum = torch.zeros(k, k, dtype=torch.float64, device=z.device), z.new_zeros(k)
                self.zq = z.new_zeros(z.shape[1], k)
        z -= self.shift
        self.sums += z.sum(dim=0)
        self.zz.addmm_(z.T, z)
        self.n += rows
        if self.unbiased:  # each row's squared norm in each series (the Gram matrices' diagonals)
            q = torch.stack([torch.einsum("ij,ij->i", z[:, b], z[:, b]) for b in self.blocks], dim=1)
            self.qq.addmm_(q.T, q)
            self.qsum += q.sum(dim=0)
            self.zq.addmm_(z.T, q)

    def save(self, path: Path) -> None:
        """This rank's sums, for rank 0's merge."""
        extra = {k: getattr(self, k).cpu().numpy() for k in ("qq", "qsum", "zq")} if self.unbiased else {}
        with open(path, "wb") as f:
            np.savez(f, n=self.n, shift=self.shift.cpu().numpy(), sums=self.sums.cpu().numpy(),
                     zz=self.zz.cpu().numpy(), **extra)

    def merge(self, path: Path) -> None:
        """Add another rank's sums, moved from its shift to this one's (exact algebra: the sums of
        (z - s) and (z - s)(z - s)^T over its rows; unbiased: of their squared norms, measures.moved)."""
        with np.load(path) as f:
            n, sums, zz = int(f["n"]), *(torch.from_numpy(f[k]).to(self.zz.device) for k in ("sums", "zz"))
            d = torch.from_numpy(f["shift"]).to(self.zz.device) - self.shift
            if self.unbiased:
                parts = m.moved(f["qq"], f["qsum"], f["zq"], f["zz"], f["sums"], n, d.cpu().numpy(), self.blocks)
                for name, part in zip(("qq", "qsum", "zq"), parts, strict=True):
                    getattr(self, name).add_(torch.from_numpy(part).to(self.zz.device))
        self.zz += zz + torch.outer(sums, d) + torch.outer(d, sums) + n * torch.outer(d, d)
        self.sums += sums + n * d
        self.n += n

    def matrix(self, shape: tuple[int, int]) -> np.ndarray:
        """The centred cross-covariances, made from the sums in place (the end of the run: nothing is added
        after), then every pair from its block, read without a copy. Unbiased: the HSIC of every pair its
        ratio needs, from the uncentred sums."""
        block = self.blocks
        zz, sums, shift = self.zz.diagonal().cpu().numpy(), self.sums.cpu().numpy(), self.shift.cpu().numpy()
        self.constant = [m.within_noise(sums[b], zz[b], self.n, shift[b]) for b in block]  # no feature varies
        if self.unbiased:
            sums = {k: getattr(self, k).cpu().numpy() for k in ("zz", "sums", "zq", "qq", "qsum")}
            h = m.unbiased_hsics(**sums, n=self.n, block=block, pairs=self.pairs)
            out = np.array([h[i, j] / np.sqrt(h[i, i] * h[j, j]) for i, j in self.pairs])
            return m.undefined(out, self.pairs, self.constant).reshape(shape)
        self.zz.addr_(self.sums, self.sums, alpha=-1.0 / self.n)
        c = self.zz.cpu().numpy()
        norms = [np.sqrt(np.einsum("ij,ij->", c[b, b], c[b, b])) for b in block]
        out = np.array([m.cka_from_covariances(c[block[i], block[j]], norms[i], norms[j]) for i, j in self.pairs])
        return m.undefined(out, self.pairs, self.constant).reshape(shape)


class MinibatchRoute:
    """Nguyen et al. 2021: unbiased HSIC of every pair summed over the full batches (a smaller last
    batch left out); CKA = mean HSIC(K, L) / sqrt(mean HSIC(K, K) mean HSIC(L, L))."""

    def __init__(self, pairs: list[tuple[int, int]], batch: int) -> None:
        self.pairs, self.batch = pairs, batch
        self.hsic: torch.Tensor | None = None
        self.batches = 0
        self.left = 0  # the rows of smaller batches (a last one), left out
        self.constant: list[bool] = []  # per series, set by matrix(): constant within every batch
        # per feature of every series side by side: its spread within each full batch, and its squares, summed (float64)
        self.spread: torch.Tensor | None = None
        self.squares: torch.Tensor | None = None
        self.blocks: list[slice] = []  # each series' features in spread and squares

    def add(self, series: list[torch.Tensor]) -> None:
        n = len(series[0])
        if n != self.batch:
            self.left += n
            return
        x = [s.reshape(n, -1).to(torch.float64, copy=True) for s in series]
        parts = []
        for a in x:  # the estimator is unchanged by a shift of the rows; a constant series is then 0
            first = a[0].clone()
            a -= first
            parts.append(m.spread_and_squares(a.sum(dim=0), torch.einsum("ij,ij->j", a, a), n, first))
        spread, squares = (torch.cat(p) for p in zip(*parts, strict=True))
        if self.spread is None:
            o = np.cumsum([0] + [a.shape[1] for a in x]).tolist()
            self.blocks = [slice(i, j) for i, j in zip(o[:-1], o[1:], strict=True)]
            self.spread, self.squares = spread, squares
        else:
            self.spread += spread
            self.squares += squares
        grams = torch.stack([a @ a.T for a in x])
        grams.diagonal(dim1=1, dim2=2).zero_()
        flat, rows = grams.reshape(len(x), -1), grams.sum(dim=2)
        tot = rows.sum(dim=1)
        h = (flat @ flat.T + torch.outer(tot, tot) / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * (rows @ rows.T)) \
            / (n * (n - 3))
        self.hsic = h if self.hsic is None else self.hsic + h
        self.batches += 1

    def save(self, path: Path) -> None:
        none = np.zeros(0)
        with open(path, "wb") as f:
            np.savez(f, batches=self.batches, left=self.left, hsic=none if self.hsic is None else self.hsic.cpu().numpy(),
                     spread=none if self.spread is None else self.spread.cpu().numpy(),
                     squares=none if self.squares is None else self.squares.cpu().numpy(),
                     dims=np.array([b.stop - b.start for b in self.blocks], dtype=np.int64))

    def merge(self, path: Path) -> None:
        """Another rank's sums over its full batches (the ranks' batches are one process's)."""
        with np.load(path) as f:
            self.left += int(f["left"])
            if int(f["batches"]):
                h, spread, squares = (torch.from_numpy(f[k]) for k in ("hsic", "spread", "squares"))
                if self.hsic is None:
                    o = np.cumsum([0, *f["dims"].tolist()]).tolist()
                    self.blocks = [slice(i, j) for i, j in zip(o[:-1], o[1:], strict=True)]
                    self.hsic, self.spread, self.squares = h, spread, squares
                else:
                    self.hsic += h.to(self.hsic.device)
                    self.spread += spread.to(self.spread.device)
                    self.squares += squares.to(self.squares.device)
                self.batches += int(f["batches"])

    def matrix(self, shape: tuple[int, int]) -> np.ndarray:
        """Nguyen et al.'s CKA of every pair; a series is constant where each feature's spread within the batches,
        summed over them, is within noise of its squares (the exact route's test over all rows, which can only
        be larger: one batch of a few rows alone can come out above noise by chance) or its HSIC is 0."""
        h = self.hsic.cpu().numpy() / self.batches
        spread, squares = self.spread.cpu().numpy(), self.squares.cpu().numpy()
        flat = [bool((spread[b] <= m.NOISE * squares[b]).all()) for b in self.blocks]
        self.constant = [f or not v for f, v in zip(flat, np.diag(h), strict=True)]  # (up to rounding)
        out = np.array([h[i, j] / np.sqrt(h[i, i] * h[j, j]) for i, j in self.pairs])
        return m.undefined(out, self.pairs, self.constant).reshape(shape)


def accumulator(route: str, pairs: list[tuple[int, int]], measure: str = "linear_cka", sigma: float = 0.8,
                dissimilarity: str = "correlation", batch: int = 0, held: int = 0,
                unbiased: bool = False) -> FeatureRoute | GramRoute | MinibatchRoute:
    """The route's accumulator for these pairs (see the table above); `held`: the bytes of rows the gram
    route may keep in memory before it spools them (what `memory` leaves beside its route_bytes);
    `unbiased`: CKA from the unbiased HSIC (estimator: unbiased)."""
    if route == "feature":
        return FeatureRoute(pairs, unbiased)
    if route == "gram":
        return GramRoute(pairs, measure, sigma, dissimilarity, held, unbiased)
    return MinibatchRoute(pairs, batch)
