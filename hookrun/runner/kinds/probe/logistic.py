"""L2-regularised logistic regression as scikit-learn's LogisticRegression(C, solver="lbfgs") defines
it, minimised by full-batch L-BFGS over rows read block by block (in memory or from the spill file).

    w, b, info = fit_logistic(blocks, y, classes=3, C=1.0, rows=train_rows)

The objective is sklearn's (linear_model/_logistic.py, _linear_loss.py), scaled by 1 / n:
    f(W, b) = (1/n) sum_i loss_i + ||W||^2 / (2 C n)      (the intercept is not penalised)
with the multinomial loss logsumexp(z_i) - z_i[y_i] (z_i = W x_i + b, W: (classes, d)) from three
classes, and for two sklearn's binary form: one vector w, loss softplus(z_i) - y_i z_i with y_i = 1
for the second class. scipy's L-BFGS-B drives it with sklearn's options (maxls 50, gtol = tol,
ftol = 64 eps) from zeros, restarted from where it stopped (up to RESTARTS times, within max_iter) while
max |gradient| > tol: converged means the gradient test (within 100 x tol where scipy stopped at float
precision), not scipy's ftol stop alone; each function evaluation is one pass over the blocks (the training rows
alone where fit.py copied them apart within the budget; else every row, the others masked), computed
in float64 with numpy on a CPU block (its memory, no copy) and with torch on a GPU's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

Blocks = Callable[[], Iterable[tuple[int, torch.Tensor]]]  # () -> (first row, features) over every row
RESTARTS = 4  # L-BFGS-B restarted from where it stopped short of the gradient test at most this often
ONE_THREAD_BELOW = 32 * 2**20  # rows x features under which the CPU solver runs on one BLAS thread


def solver_threads(rows: int, features: int, device: torch.device | str) -> contextlib.AbstractContextManager:
    """One BLAS thread for the solver's loop, unless its rows are on the CPU and large.

    L-BFGS calls BLAS hundreds of times on small operands (the scores' product, the gradient's, and
    scipy's own vectors), with Python between the calls, so OpenBLAS's threads fall asleep and are
    woken for every call. On 2 cores that made a 768 x 512 four-class solve take 0.85 s on two
    threads against 0.08 s on one (the same iterations); one thread stays faster up to about
    20000 x 2048 rows x features (1.88 s against 1.85 s), beyond which the products' own size wins
    (40000 x 2048: 1.74 s on two, 2.22 s on one). On a GPU the products are torch's and BLAS only
    runs scipy's vectors."""
    if torch.device(device).type == "cpu" and rows * features > ONE_THREAD_BELOW:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


@dataclass
class LogisticFit:
    coef: np.ndarray  # (classes, d); (1, d) for two classes
    intercept: np.ndarray  # (classes,); (1,) for two classes
    objective: float  # sklearn's scaled objective at the optimum
    iterations: int
    converged: bool


def objective(blocks: Blocks, y: np.ndarray, rows: np.ndarray, classes: int, C: float, w: np.ndarray,
              mean: np.ndarray | None = None, scale: np.ndarray | None = None, grad: bool = True,
              engine: str | None = None) -> tuple[float, np.ndarray | None]:
    """sklearn's objective (and its gradient) at the flat parameters `w` over the rows `rows` (a bool
    mask over every row) with class indices `y` (every row's; -1 where a row has none). With `mean`
    and `scale` (StandardScaler's), `w` is in the standardised space; the blocks stay raw: the scaling
    is folded into the weights (z = x (W/s)^T + b - (W/s) mean) and the gradient, so no block is copied.
    `engine`: numpy or torch; by default numpy on a CPU block, torch on a GPU's."""
    k = 1 if classes == 2 else classes
    n = int(rows.sum())
    params = w.reshape(k, -1)
    coefs, icpt = params[:, :-1], params[:, -1]
    d = coefs.shape[1]
    mean = np.zeros(d) if mean is None else mean
    scale = np.ones(d) if scale is None else scale
    raw = coefs / scale
    bias = icpt - raw @ mean  # the scores' intercept in the raw space
    wt = bt = None
    total = 0.0
    gx = np.zeros((k, d))
    gb = np.zeros(k)
    for start, x in blocks():
        sel = rows[start:start + len(x)]
        if not sel.any():
            continue
        every = bool(sel.all())  # (training rows copied apart: no mask to apply)
        yb = y[start:start + len(x)] if every else np.where(sel, y[start:start + len(x)], 0)
        if (engine or ("numpy" if x.device.type == "cpu" else "torch")) == "numpy":  # no dispatch per op
            xn = x.numpy()
            loss, r = _residual(xn @ raw.T + bias, yb, k)
            m = 1.0 if every else sel.astype(xn.dtype)
            total += float((m * loss).sum())
            if grad:
                r = r if every else r * m[:, None]
                gx += r.T @ xn
                gb += r.sum(0)
            continue
        if wt is None:
            wt = torch.from_numpy(raw).to(x.device)
            bt = torch.from_numpy(bias).to(x.device)
        mt = 1.0 if every else torch.from_numpy(sel).to(x.device, x.dtype)
        yi = torch.from_numpy(yb).to(x.device)
        z = x @ wt.T + bt
        if k == 1:
            z = z[:, 0]
            yf = (yi == 1).to(z.dtype)
            total += float((mt * (torch.nn.functional.softplus(z) - yf * z)).sum())
            rt = ((torch.sigmoid(z) - yf) * mt)[:, None]
        else:
            total += float((mt * (torch.logsumexp(z, 1) - z.gather(1, yi[:, None])[:, 0])).sum())
            rt = torch.softmax(z, 1)
            rt[torch.arange(len(yi), device=rt.device), yi] -= 1.0
            rt = rt if every else rt * mt[:, None]
        if grad:
            gx += (rt.T @ x).cpu().numpy()
            gb += rt.sum(0).cpu().numpy()
    f = total / n + float((coefs ** 2).sum()) / (2 * C * n)
    if not grad:
        return f, None
    g = np.concatenate([(gx - np.outer(gb, mean)) / scale / n + coefs / (C * n), gb[:, None] / n], 1)
    return f, g.reshape(-1)


def _residual(z: np.ndarray, y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's loss and d loss / d z at the scores `z` (rows, k): the binary form where k is 1."""
    if k == 1:
        z = z[:, 0]
        yf = (y == 1).astype(z.dtype)
        return np.logaddexp(0.0, z) - yf * z, (np.exp(-np.logaddexp(0.0, -z)) - yf)[:, None]
    top = z.max(1, keepdims=True)
    e = np.exp(z - top)
    s = e.sum(1)
    at = np.arange(len(y))
    loss = np.log(s) + top[:, 0] - z[at, y]
    e /= s[:, None]
    e[at, y] -= 1.0
    return loss, e


def fit_logistic(blocks: Blocks, y: np.ndarray, rows: np.ndarray, classes: int, d: int, C: float,
                 tol: float = 1e-8, max_iter: int = 1000,
                 mean: np.ndarray | None = None, scale: np.ndarray | None = None) -> LogisticFit:
    """Minimise the objective from zeros with scipy's L-BFGS-B (sklearn's options); the weights come
    back in the standardised space where `mean` and `scale` are given."""
    from scipy import optimize

    k = 1 if classes == 2 else classes
    w, used, restarts = np.zeros(k * (d + 1)), 0, 0
    while True:
        res = optimize.minimize(
            lambda v: objective(blocks, y, rows, classes, C, v, mean, scale), w, method="L-BFGS-B", jac=True,
            options={"maxiter": max_iter - used, "maxls": 50, "gtol": tol, "ftol": 64 * np.finfo(float).eps})
        w, used = res.x, used + int(res.nit)
        g = float(np.max(np.abs(res.jac)))
        # converged: the gradient test (max |g| <= tol, scipy's pgtol), or a stop at float precision with the
        # gradient near tol (within 100 x): scipy's ftol stop ("relative reduction of f <= factr * epsmch",
        # status 0: a standardised probe's at 2 to 8 x tol) or a line search that ended there (ABNORMAL,
        # status 2). An ill-conditioned fit (unstandardised features x1e3, a large C) stops on ftol with max |g|
        # 500 x tol, its objective 1e-6 relative above the optimum: not converged, restarted from there.
        done = g <= tol or (res.status in (0, 2) and g <= 100 * tol)
        if done or used >= max_iter or restarts == RESTARTS or int(res.nit) == 0:
            break
        restarts += 1  # (from where it stopped, with a fresh curvature memory)
    w = w.reshape(k, d + 1)
    return LogisticFit(w[:, :-1].copy(), w[:, -1].copy(), float(res.fun), used, done)
