"""Numbers about a capture: exact statistics read block by block, and byte counts for people.

    block_stats(f["captures/fmap/layer1.0/output"])  # {'mean': ..., 'std': ..., 'zeros': ...}
    human_bytes(3 << 20)                               # '3.0 MiB'
"""

from __future__ import annotations

import h5py
import numpy as np

from hookrun.analysis.kind_readers import no_values_note  # (a kind's own captures: its reader says)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def block_stats(ds: h5py.Dataset, rows_per_block: int | None = None) -> dict[str, float]:
    """Exact mean/std/min/max/zeros of a dataset, in float64, reading one block of rows at a time."""
    n_rows = ds.shape[0]
    per_row = int(np.prod(ds.shape[1:], dtype=np.int64)) or 1
    step = rows_per_block or max(1, (64 << 20) // (per_row * 8))  # about 64 MiB of float64 a block
    count, lo, hi, zeros = 0, np.inf, -np.inf, 0
    mean, m2 = 0.0, 0.0
    for start in range(0, n_rows, step):
        raw = ds[start : start + step]
        if raw.dtype == object:  # variable-length rows (detection boxes): each row a 1-D array
            raw = np.concatenate([np.asarray(r, dtype=np.float64).ravel() for r in raw]) if len(raw) else np.zeros(0)
        block = np.asarray(raw, dtype=np.float64).ravel()
        if not block.size:
            continue
        b_mean = block.mean()
        b_m2 = ((block - b_mean) ** 2).sum()
        n = count + block.size
        delta = b_mean - mean
        mean += delta * block.size / n  # Chan et al.: merge the block's moments
        m2 += b_m2 + delta**2 * count * block.size / n
        count = n
        lo, hi = min(lo, block.min()), max(hi, block.max())
        zeros += int((block == 0).sum())
    if count == 0:
        return {"mean": float("nan"), "std": float("nan"), "min": float("nan"), "max": float("nan"), "zeros": float("nan"), "count": 0}
    return {"mean": float(mean), "std": float(np.sqrt(m2 / count)), "min": float(lo), "max": float(hi),
            "zeros": zeros / count, "count": count}


def no_values(label: str, s: dict) -> str:
    """What a summary says of a capture with no finite value (its block_stats `s`), instead of
    "mean nan std nan min inf max -inf"."""
    note = no_values_note(label)
    if note is not None:
        return note
    return "no values written" if not s.get("count") else f"no finite value ({s['count']} values, all NaN)"
