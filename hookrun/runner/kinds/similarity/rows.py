"""The gram route's rows: every series' rows held in memory within a budget (what `similarity.memory`
leaves beside the route's n x n matrices), beyond it spooled to one file per series in the kind's
scratch folder (output/scratch.py); read back in slabs of columns as float64, one buffer reused.

    rows = SeriesRows(budget=bytes)
    rows.scratch = lambda: Scratch(cfg.output, "similarity_rows", rank)   # where a spool goes (else a temp folder)
    rows.add([each series' (batch rows, features) tensor])   # new memory (the hook's copy): held as it is
    for part in rows.slabs(k, step): ...                       # series k's (n, <= step) float64 columns
    for part in rows.slabs(k, step, shift=rows.first(k)): ...  # (CKA, Euclidean RSA: less the first row)
    for part in rows.slabs(k, step, shift=means, per_row=True): ...  # (RSA's correlation: each item less its mean)

Rows are float32 (a float32 or half model's; exact) or float64 (pooled rows), as they came. Many ranks:
each rank but 0 `save`s its rows to a folder, rank 0 `merge`s them after its own (spooled).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookrun.error_words import write_reason
from hookrun.errors import RunError
from hookrun.output.scratch import Scratch


class SeriesRows:
    def __init__(self, budget: int = 0) -> None:
        self.budget = budget  # bytes of rows held in memory; past them every row goes to the spool
        self.scratch: Callable[[], Scratch] | None = None  # the kind's: makes the spool's folder when first needed
        self.dir: Scratch | None = None
        self.files: list[Any] = []
        self.held: list[list[np.ndarray]] = []
        self.held_bytes = 0
        self.dims: list[int] = []
        self.dtypes: list[np.dtype] = []
        self.n = 0

    def add(self, series: list[torch.Tensor]) -> None:
        arrays = [s.reshape(len(s), -1).to(torch.float64 if s.dtype == torch.float64 else torch.float32).cpu().numpy()
                  for s in series]
        if not self.dims:
            self.dims, self.dtypes, self.held = [a.shape[1] for a in arrays], [a.dtype for a in arrays], [[] for _ in arrays]
        size = sum(a.nbytes for a in arrays)
        if not self.files and self.held_bytes + size <= self.budget:
            for held, a in zip(self.held, arrays, strict=True):
                held.append(np.ascontiguousarray(a))
            self.held_bytes += size
        else:
            with self.spool_writes():
                self.spill()
                for f, a in zip(self.files, arrays, strict=True):
                    f.write(np.ascontiguousarray(a).data)
        self.n += len(arrays[0])

    @contextlib.contextmanager
    def spool_writes(self) -> Iterator[None]:
        """A write to the spool that fails (a full disk) as one RunError line naming its folder."""
        try:
            yield
        except OSError as exc:
            where = self.dir.path if self.dir is not None else "the scratch folder"
            raise RunError(f"similarity: writing the rows beyond similarity.memory to {where} failed: {write_reason(exc)}; "
                           "free some space there, or raise similarity.memory to hold them in memory") from exc

    def spill(self) -> None:
        """From here on every row goes to the spool, the rows held so far first."""
        if self.files or not self.dims:
            return
        if self.dir is None:  # (the kind's scratch beside the run's file; else the system's temporary folder)
            self.dir = self.scratch() if self.scratch is not None else Scratch(None, "similarity_rows")
        self.files = [open(self.dir.path / f"{k}.rows", "wb") for k in range(len(self.dims))]
        for f, held in zip(self.files, self.held, strict=True):
            for a in held:
                f.write(a.data)
        self.held, self.held_bytes = [[] for _ in self.dims], 0

    def save(self, path: Path) -> None:
        """This rank's rows (a folder of one file per series), for rank 0's merge."""
        path.mkdir()
        for k in range(len(self.dims)):
            if self.files:
                self.files[k].flush()
                shutil.copyfile(self.files[k].name, path / f"{k}.rows")
            else:
                with open(path / f"{k}.rows", "wb") as f:
                    for a in self.held[k]:
                        f.write(a.data)
        (path / "rows").write_text(str(self.n))

    def merge(self, path: Path) -> None:
        """Another rank's rows after this one's (rank order is item order: the same Gram matrices)."""
        with self.spool_writes():
            self.spill()
            for k, f in enumerate(self.files):
                with open(path / f"{k}.rows", "rb") as src:
                    shutil.copyfileobj(src, f)
        self.n += int((path / "rows").read_text())

    def sources(self, k: int) -> list[np.ndarray]:
        """Series k's rows as they are kept: the arrays held, or its spool mapped as one array."""
        if not self.files:
            return self.held[k]
        with self.spool_writes():
            self.files[k].flush()
        return [np.memmap(self.files[k].name, dtype=self.dtypes[k], mode="r", shape=(self.n, self.dims[k]))]

    def first(self, k: int) -> np.ndarray:
        """Series k's first row, as float64."""
        return self.sources(k)[0][0].astype(np.float64)

    def slabs(self, k: int, step: int, shift: np.ndarray | None = None, per_row: bool = False,
              dtype: type = np.float64) -> Iterator[np.ndarray]:
        """Series k's rows, `step` columns at a time, as float64 (or `dtype`) in one reused buffer (n, <= step);
        with `shift` (a value per column, or with `per_row` per row) the rows less it, in that dtype."""
        d, src = self.dims[k], self.sources(k)
        buf = np.empty((self.n, min(step, d)), dtype=dtype)
        for c in range(0, d, step):
            part = buf[:, :min(step, d - c)]
            r = 0
            for a in src:  # (a cast copy, then the shift in place: a fifth faster than numpy's mixed subtraction)
                rows = part[r:r + len(a)]
                rows[:] = a[:, c:c + part.shape[1]]
                if shift is not None:
                    rows -= shift[r:r + len(a), None] if per_row else shift[c:c + part.shape[1]]
                r += len(a)
            yield part

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.held = []
        if self.dir is not None:
            self.dir.cleanup()
