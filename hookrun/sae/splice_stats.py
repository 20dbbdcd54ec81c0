"""What a splice does to the activations it replaces, accumulated in float64 over a run.

    stats = SpliceStats(d_sae=256); stats.enabled = True
    stats.add(x, x_hat, latents, valid)     # each spliced forward (valid: (B, T) real tokens, or None)
    stats.batch()   # {"l0": ..., "mse": ..., "explained_variance": ..., "dead_fraction": ...} since reset_batch()
    stats.totals()  # the same over the whole run

With n the rows (tokens, padding excluded), SAELens' definitions:
    l0                  = sum over rows of #(latents > 0) / n
    mse                 = sum ||x - x_hat||^2 / (n * d_in)
    explained_variance  = 1 - (sum ||x - x_hat||^2 / n) / Var(x),  Var(x) = sum ||x||^2 / n - ||sum x / n||^2
    dead_fraction       = the share of latents never > 0 in the run so far
Sums (not means of batch means) are kept, so the run's figures are exact whatever the batch sizes.
No torch hooks here: the splice op (hooks/splice.py) calls add().
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


class _Sums:
    def __init__(self) -> None:
        self.n = 0
        self.sq_err = 0.0
        self.sq = 0.0
        self.active = 0.0
        self.sum_x: Tensor | None = None  # float64 (d_in,)

    def add(self, x: Tensor, err: Tensor, active: float) -> None:
        self.n += x.shape[0]
        self.sq_err += float(err.pow(2).sum())
        self.sq += float(x.pow(2).sum())
        s = x.sum(0)
        self.sum_x = s if self.sum_x is None else self.sum_x.to(s.device) + s  # (a resumed run loads it on the host)
        self.active += active

    def metrics(self, fired: Tensor | None) -> dict[str, float]:
        nan = float("nan")
        if not self.n or self.sum_x is None:
            return {"l0": nan, "mse": nan, "explained_variance": nan, "dead_fraction": nan}
        d = self.sum_x.numel()
        var = self.sq / self.n - float((self.sum_x / self.n).pow(2).sum())
        return {
            "l0": self.active / self.n if fired is not None else nan,
            "mse": self.sq_err / (self.n * d),
            "explained_variance": 1.0 - (self.sq_err / self.n) / var if var > 0 else nan,
            "dead_fraction": float((~fired).float().mean()) if fired is not None else nan,
        }


class SpliceStats:
    def __init__(self, d_sae: int | None) -> None:
        self.d_sae = d_sae
        self.enabled = False  # a kind that measures splices turns it on (reset_batch)
        self.run, self.this = _Sums(), _Sums()
        self.fired: Tensor | None = None  # (d_sae,) bool: ever > 0 in the run

    def reset_batch(self) -> None:
        self.enabled = True
        self.this = _Sums()

    def add(self, x: Tensor, x_hat: Tensor, latents: Tensor | None, valid: Tensor | None) -> None:
        with torch.no_grad():
            x64 = x.detach().to(torch.float64)
            rows = x64[valid] if valid is not None else x64.reshape(-1, x64.shape[-1])
            err = rows - (x_hat.detach().to(torch.float64)[valid] if valid is not None
                          else x_hat.detach().to(torch.float64).reshape(-1, x64.shape[-1]))
            active = 0.0
            if latents is not None:
                f = latents.detach()
                f = f[valid] if valid is not None else f.reshape(-1, f.shape[-1])
                on = f > 0
                active = float(on.sum(dtype=torch.float64))
                hit = on.any(0).cpu()
                self.fired = hit if self.fired is None else self.fired | hit
            for sums in (self.run, self.this):
                sums.add(rows, err, active)

    def batch(self) -> dict[str, float]:
        return self.this.metrics(self.fired)

    def totals(self) -> dict[str, float]:
        return self.run.metrics(self.fired)


    def state(self) -> dict[str, np.ndarray]:
        """The run's sums as arrays, which a measuring kind writes at each flush so that a resumed run's
        totals go on from the batches it keeps (load_state)."""
        r = self.run
        out = {"n": np.array(r.n), "sq_err": np.array(r.sq_err), "sq": np.array(r.sq), "active": np.array(r.active)}
        if r.sum_x is not None:
            out["sum_x"] = r.sum_x.cpu().numpy()
        if self.fired is not None:
            out["fired"] = self.fired.cpu().numpy()
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        r = self.run
        r.n, r.sq_err, r.sq, r.active = int(state["n"]), float(state["sq_err"]), float(state["sq"]), float(state["active"])
        r.sum_x = torch.from_numpy(np.asarray(state["sum_x"])) if "sum_x" in state else None
        self.fired = torch.from_numpy(np.asarray(state["fired"]).astype(bool)) if "fired" in state else None
