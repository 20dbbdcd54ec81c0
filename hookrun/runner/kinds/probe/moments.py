"""Sufficient statistics merged batch by batch (Chan, Golub & LeVeque's pairwise update, float64):
the count, the mean and the co-moment matrix of the rows, exact for any number of rows and any split
into batches (ranks merge theirs the same way); StandardScaler's scale and Ridge's solution from them.

    m = Moments(); m.add(z_batch); m.add(z_next)        # z: (rows, columns) float64
    m.mean, m.comoment                                  # = z.mean(0), (z - mean).T @ (z - mean)
    w, b = ridge_solve(m, d, alpha, scale)              # sklearn.linear_model.Ridge on [x | y] rows

`ridge_solve` takes the moments of the joined rows [features | targets]: Ridge with an intercept
solves (Xc^T Xc + alpha I) W = Xc^T Yc on the centred rows, the intercept is mean(Y) - mean(X) W.
With a scale (StandardScaler's, `scaler_scale`), the solution is in the standardised space, as a
pipeline StandardScaler -> Ridge fits it.
"""

from __future__ import annotations

import numpy as np
import torch


class Moments:
    """diag=True keeps only the co-moment's diagonal (the sums of squared deviations: a variance)."""

    def __init__(self, diag: bool = False) -> None:
        self.diag = diag
        self.n = 0
        self.mean: torch.Tensor | None = None
        self.comoment: torch.Tensor | None = None

    def add(self, z: torch.Tensor) -> None:
        z = z.to(torch.float64)
        nb = z.shape[0]
        if nb == 0:
            return
        mb = z.mean(0)
        c = z - mb
        self.merge(nb, mb, (c * c).sum(0) if self.diag else c.T @ c)

    def merge(self, nb: int, mb: torch.Tensor, cb: torch.Tensor) -> None:
        if self.n == 0:
            self.n, self.mean, self.comoment = nb, mb.clone(), cb.clone()
            return
        n = self.n + nb
        delta = mb - self.mean
        cross = delta * delta if self.diag else torch.outer(delta, delta)
        self.comoment = self.comoment + cb + cross * (self.n * nb / n)
        self.mean = self.mean + delta * (nb / n)
        self.n = n


def scaler_scale(mean: np.ndarray, var: np.ndarray, n: int) -> np.ndarray:
    """StandardScaler's scale_: the population std, 1 where sklearn finds the feature constant
    (var <= n eps var + (n mean eps)^2, sklearn.preprocessing._data._is_constant_feature)."""
    eps = np.finfo(np.float64).eps
    constant = var <= n * eps * var + (n * mean * eps) ** 2
    scale = np.sqrt(var)
    scale[constant] = 1.0
    return scale


def ridge_solve(m: Moments, d: int, alpha: float, scale: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(coef (targets, d), intercept (targets,)) of Ridge(alpha) with an intercept on the rows whose
    joined moments are `m` (features first, then targets); in the standardised space where `scale`
    is given (the features' mean is then 0, so the intercept is the targets' mean)."""
    from scipy import linalg

    cm = m.comoment.cpu().numpy()
    mean = m.mean.cpu().numpy()
    sxx, sxy = cm[:d, :d], cm[:d, d:]
    x_mean = mean[:d]
    if scale is not None:
        sxx = sxx / np.outer(scale, scale)
        sxy = sxy / scale[:, None]
        x_mean = np.zeros(d)
    a = sxx + alpha * np.eye(d)
    try:
        coef = linalg.solve(a, sxy, assume_a="pos", overwrite_a=False)
    except linalg.LinAlgError:  # (alpha 0 on a singular matrix: the least-squares solution, as sklearn falls back)
        coef = linalg.lstsq(a, sxy)[0]
    return coef.T, mean[d:] - x_mean @ coef
