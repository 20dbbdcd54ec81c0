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
    """Exact mean/std/min/max/zeros of a dataset's finite values, in float64, reading one block of
    rows at a time; `count` finite values of `values`, `nonfinite` the NaN and inf left out (an edges
    grid's cells that are not edges are NaN: its statistics are those of the edges)."""
    n_rows = ds.shape[0]
    per_row = int(np.prod(ds.shape[1:], dtype=np.int64)) or 1
    step = rows_per_block or max(1, (64 << 20) // (per_row * 8))  # about 64 MiB of float64 a block
    blocks = []
    for start in range(0, n_rows, step):
        raw = ds[start : start + step]
        if raw.dtype == object:  # variable-length rows (detection boxes): each row a 1-D array
            raw = np.concatenate([np.asarray(r, dtype=np.float64).ravel() for r in raw]) if len(raw) else np.zeros(0)
        blocks.append(values_stats(np.asarray(raw, dtype=np.float64).ravel()))
    return merge_stats(blocks)


def values_stats(values: np.ndarray) -> dict[str, float]:
    """block_stats of one block of float64 values."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return {**merge_stats([]), "values": int(values.size), "nonfinite": int(values.size)}
    mean = finite.mean()
    return {"mean": float(mean), "std": float(np.sqrt(((finite - mean) ** 2).mean())), "min": float(finite.min()),
            "max": float(finite.max()), "zeros": float((finite == 0).mean()), "count": int(finite.size),
            "values": int(values.size), "nonfinite": int(values.size - finite.size)}


def merge_stats(blocks: list[dict]) -> dict[str, float]:
    """The statistics of several blocks' values together (Chan et al.: their moments merged); the
    object-store reader merges its parts' the same way."""
    count, mean, m2, lo, hi, zeros, values = 0, 0.0, 0.0, np.inf, -np.inf, 0.0, 0
    for b in blocks:
        n = b["count"]
        values += b["values"]
        if not n:
            continue
        delta, total = b["mean"] - mean, count + n
        mean += delta * n / total
        m2 += b["std"] ** 2 * n + delta**2 * count * n / total
        count, lo, hi, zeros = total, min(lo, b["min"]), max(hi, b["max"]), zeros + b["zeros"] * n
    if not count:
        nan = float("nan")
        return {"mean": nan, "std": nan, "min": nan, "max": nan, "zeros": nan, "count": 0, "values": values, "nonfinite": values}
    return {"mean": float(mean), "std": float(np.sqrt(m2 / count)), "min": float(lo), "max": float(hi),
            "zeros": zeros / count, "count": count, "values": values, "nonfinite": values - count}


def nonfinite_note(s: dict) -> str:
    """' nonfinite N (P%)' where a capture holds NaN or inf beside its finite values, else ''."""
    n = s["nonfinite"]
    return f" nonfinite {n} ({n / s['values']:.1%}, left out of the statistics)" if n and s["count"] else ""


def no_values(label: str, s: dict) -> str:
    """What a summary says of a capture with no finite value (its block_stats `s`), instead of
    "mean nan std nan min inf max -inf"."""
    note = no_values_note(label)
    if note is not None:
        return note
    return "no values written" if not s["values"] else f"no finite value ({s['values']} values, all NaN or inf)"
