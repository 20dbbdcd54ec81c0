"""L2-regularised logistic regression as scikit-learn's LogisticRegression(C, solver="lbfgs") defines
it, minimised by full-batch L-BFGS over rows read block by block (in memory or from the spill file).

    w, b, info = fit_logistic(blocks, y, classes=3, C=1.0, rows=train_rows)

The objective is sklearn's (linear_model/_logistic.py, _linear_loss.py), scaled by 1 / n:
    f(W, b) = (1/n) sum_i loss_i + ||W||^2 / (2 C n)      (the intercept is not penalised)
with the multinomial loss logsumexp(z_i) - z_i[y_i] (z_i = W x_i + b, W: (classes, d)) from three
classes, and for two sklearn's binary form: one vector w, loss softplus(z_i) - y_i z_i with y_i = 1
for the second class. scipy's L-BFGS-B drives it with sklearn's options (maxls 50, gtol = tol,
ftol = 64 eps) from zeros; each function evaluation is one pass over the blocks, computed with torch
in float64 on the blocks' device (a GPU where the run has one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

Blocks = Callable[[], Iterable[tuple[int, torch.Tensor]]]  # () -> (first row, features) over every row


@dataclass
class LogisticFit:
    coef: np.ndarray  # (classes, d); (1, d) for two classes
    intercept: np.ndarray  # (classes,); (1,) for two classes
    objective: float  # sklearn's scaled objective at the optimum
    iterations: int
    converged: bool


def objective(blocks: Blocks, y: np.ndarray, rows: np.ndarray, classes: int, C: float, w: np.ndarray,
              transform: Callable[[torch.Tensor], torch.Tensor] | None = None, grad: bool = True
              ) -> tuple[float, np.ndarray | None]:
    """sklearn's objective (and its gradient) at the flat parameters `w` over the rows `rows` (a bool
    mask over every row) with class indices `y` (every row's; -1 where a row has none)."""
    k = 1 if classes == 2 else classes
    n = int(rows.sum())
    wt = None
    total = 0.0
    g = np.zeros_like(w)
    for start, x in blocks():
        sel = torch.from_numpy(rows[start:start + len(x)]).to(x.device)
        if not bool(sel.any()):
            continue
        xs = x[sel]
        if transform is not None:
            xs = transform(xs)
        if wt is None:
            wt = torch.from_numpy(w.reshape(k, -1)).to(xs.device)
        yi = torch.from_numpy(y[start:start + len(x)]).to(xs.device)[sel]
        z = xs @ wt[:, :-1].T + wt[:, -1]
        if k == 1:
            z = z[:, 0]
            yb = (yi == 1).to(z.dtype)
            total += float((torch.nn.functional.softplus(z) - yb * z).sum())
            r = (torch.sigmoid(z) - yb)[:, None]
        else:
            lse = torch.logsumexp(z, 1)
            total += float((lse - z.gather(1, yi[:, None])[:, 0]).sum())
            r = torch.softmax(z, 1)
            r[torch.arange(len(yi), device=r.device), yi] -= 1.0
        if grad:
            gw = torch.cat([r.T @ xs, r.sum(0)[:, None]], 1)
            g += gw.cpu().numpy().reshape(-1)
    coefs = w.reshape(k, -1)[:, :-1]
    f = total / n + float((coefs ** 2).sum()) / (2 * C * n)
    if not grad:
        return f, None
    g /= n
    g.reshape(k, -1)[:, :-1] += coefs / (C * n)
    return f, g


def fit_logistic(blocks: Blocks, y: np.ndarray, rows: np.ndarray, classes: int, d: int, C: float,
                 tol: float = 1e-8, max_iter: int = 1000,
                 transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> LogisticFit:
    """Minimise the objective from zeros with scipy's L-BFGS-B (sklearn's options)."""
    from scipy import optimize

    k = 1 if classes == 2 else classes
    res = optimize.minimize(
        lambda w: objective(blocks, y, rows, classes, C, w, transform), np.zeros(k * (d + 1)), method="L-BFGS-B",
        jac=True, options={"maxiter": max_iter, "maxls": 50, "gtol": tol, "ftol": 64 * np.finfo(float).eps})
    w = res.x.reshape(k, d + 1)
    return LogisticFit(w[:, :-1].copy(), w[:, -1].copy(), float(res.fun), int(res.nit), bool(res.success))
