"""The probe rows of one hook point: features (float64) held in memory up to a byte budget, beyond it
kept in a spill file (raw float64 rows) and read back in blocks that fit the budget.

    store = RowStore(features=64, memory=2 * 2**30, spill="outputs/run/.probe_rows/p000.rows", name="layer1")
    store.add(x, y, key, item)                  # a batch's rows (x: (rows, 64) float64 tensor)
    for start, x in store.blocks(device):       # every row, in order, a block at a time
        ...
    store.close()                               # the spill file is removed

The row columns (target, identity key, item index) are small and always in memory; only the features
spill. Each block is at most `memory` bytes, so a full pass over the rows (a solver's function
evaluation) holds no more than the budget whatever the number of rows. The spill file is written with
plain file writes, whose failure (a full disk) is raised at the batch as one RunError line: an HDF5
spill file kept its chunks in HDF5's caches and lost those a full disk refused without an error (h5py
ignores an error raised where a dataset handle is freed), so the probe was fitted to rows of zeros.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookrun.error_words import write_reason
from hookrun.errors import RunError

BYTES = 8  # float64
BLOCK = 16 << 20  # in memory, batches are merged into blocks of up to this many bytes before a pass


class RowStore:
    def __init__(self, features: int, memory: int, spill: str | Path | None = None, name: str = "rows") -> None:
        self.features, self.memory, self.spill_path, self.name = features, int(memory), spill, name
        self.chunks: list[torch.Tensor] = []
        self.held = 0  # bytes of features in memory
        self.rows = 0
        self.file = None  # the spill file (opened for writing and reading) once the rows exceed the budget
        self.cols: dict[str, list[np.ndarray]] = {"y": [], "key": [], "item": [], "part": []}
        self.sizes: list[int] = []  # rows per add (a rank's rows are added again batch by batch: save, load)

    @property
    def spilled(self) -> bool:
        return self.file is not None

    def add(self, x: torch.Tensor, y: np.ndarray, key: np.ndarray, item: np.ndarray, part: int = 0) -> None:
        """A batch's rows: features, targets, identity keys (token id or item index), dataset item
        indices; `part` 1 marks rows of test_data."""
        x = x.detach().to("cpu", torch.float64)
        for name, v in (("y", y), ("key", key), ("item", item), ("part", np.full(len(x), part, np.int8))):
            self.cols[name].append(np.asarray(v))
        self.rows += len(x)
        self.sizes.append(len(x))
        if self.file is None and self.held + x.numel() * BYTES > self.memory:
            self._spill()
        if self.file is not None:
            self._write(x.numpy())
        else:
            self.chunks.append(x)
            self.held += x.numel() * BYTES

    def _spill(self) -> None:
        if self.spill_path is None:
            raise RuntimeError("RowStore: the rows exceed the memory budget and no spill file was given")
        self.file = open(self.spill_path, "w+b")
        for x in self.chunks:
            self._write(x.numpy())
        self.chunks, self.held = [], 0

    def _write(self, x: np.ndarray) -> None:
        """Rows at the end of the spill file; a failed write (a full disk) is one RunError line."""
        try:
            self.file.write(np.ascontiguousarray(x, dtype=np.float64).data)
        except OSError as exc:
            raise self._failed(exc) from exc

    def _spilled_rows(self) -> np.ndarray:
        """The spill file's rows, mapped (every write reached the file first: a failed one raises here)."""
        try:
            self.file.flush()
        except OSError as exc:
            raise self._failed(exc) from exc
        return np.memmap(self.file.name, dtype=np.float64, mode="r", shape=(self.rows, self.features))

    def _failed(self, exc: OSError) -> RunError:
        return RunError(f"probe: writing the rows of {self.name} beyond probe.memory to {self.spill_path} failed: "
                        f"{write_reason(exc)}; free some space there, or raise probe.memory to hold them in memory")

    def column(self, name: str) -> np.ndarray:
        parts = self.cols[name]
        if len(parts) > 1:
            self.cols[name] = parts = [np.concatenate(parts)]
        return parts[0] if parts else np.zeros(0)

    def blocks(self, device: torch.device | str = "cpu") -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, features) blocks over every row in order, each within the memory budget."""
        if self.file is None:
            self._compact()
            start = 0
            for x in self.chunks:
                yield start, x.to(device)
                start += len(x)
            return
        rows = self._spilled_rows()
        step = max(1, self.memory // (BYTES * self.features))
        for start in range(0, self.rows, step):
            yield start, torch.from_numpy(np.array(rows[start:start + step])).to(device)

    def held_subset(self, rows: np.ndarray, device: torch.device | str = "cpu") -> list[tuple[int, torch.Tensor]] | None:
        """The rows a bool mask selects, copied once into blocks of their own (a solver's many passes
        then touch only them), where the rows are held and the copy fits the budget beside them; else None."""
        if self.file is not None or self.held + int(rows.sum()) * self.features * BYTES > self.memory:
            return None
        self._compact()
        out, start, at = [], 0, 0
        for x in self.chunks:
            sel = torch.from_numpy(rows[at:at + len(x)])
            at += len(x)
            if sel.any():
                part = x[sel.to(x.device)].to(device)
                out.append((start, part))
                start += len(part)
        return out

    def _compact(self) -> None:
        """Merge runs of small held batches into blocks of up to min(BLOCK, memory) bytes (one block
        of extra memory at a time): a solver's pass then costs a few large products, not one per batch."""
        limit = max(min(BLOCK, self.memory), 1)
        merged: list[torch.Tensor] = []
        group: list[torch.Tensor] = []
        size = 0
        for x in self.chunks:
            if group and size + x.numel() * BYTES > limit:
                merged.append(torch.cat(group) if len(group) > 1 else group[0])
                group, size = [], 0
            group.append(x)
            size += x.numel() * BYTES
        if group:
            merged.append(torch.cat(group) if len(group) > 1 else group[0])
        self.chunks = merged

    def save(self, g: Any) -> None:
        """Every row, its columns and the batches' sizes into the h5py group `g` (a rank's rows for rank 0)."""
        ds = g.create_dataset("x", shape=(self.rows, self.features), dtype="f8")
        for start, x in self.blocks():
            ds[start:start + len(x)] = x.numpy()
        for name in self.cols:
            g.create_dataset(name, data=self.column(name))
        g.create_dataset("sizes", data=np.asarray(self.sizes, dtype=np.int64))

    def load(self, g: Any) -> None:
        """Add the rows `save` wrote, batch by batch as they were added (the same blocks as one process's)."""
        start = 0
        cols = {name: g[name][()] for name in self.cols}
        for n in g["sizes"][()].tolist():
            end = start + n
            part = int(cols["part"][start]) if n else 0
            self.add(torch.from_numpy(g["x"][start:end]), cols["y"][start:end], cols["key"][start:end],
                     cols["item"][start:end], part)
            start = end

    def close(self) -> None:
        """Drop the rows; the spill file is removed."""
        self.chunks = []
        if self.file is not None:
            path = Path(self.file.name)
            self.file.close()
            self.file = None
            path.unlink(missing_ok=True)
