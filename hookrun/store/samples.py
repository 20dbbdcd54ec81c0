"""The /samples group: what each row of a run is (dataset index, batch, target, path, batch keys,
token map), appended batch by batch beside the captures.

    table = SampleTable(file, compression=None)
    table.write(step_record, start=samples_before)

/samples/index and /samples/step exist from the start; target, path, the `data.store` keys, the
generated text and the token map (/samples/token_sample, token_position, token_generated) appear
at the first batch that has them, backfilled to the rows before. docs/format.md describes each.
"""

from __future__ import annotations

import h5py
import numpy as np

from hookrun.errors import RunError
from hookrun.store.chunks import append, new_dataset
from hookrun.store.records import StepRecord

TOKEN_NAMES = ("token_sample", "token_position", "token_generated")


class SampleTable:
    def __init__(self, file: h5py.File, compression: str | None) -> None:
        self.file, self.compression = file, compression
        group = file.create_group("samples")
        self.index = group.create_dataset("index", (0,), "int64", maxshape=(None,), chunks=(8192,))
        self.step = group.create_dataset("step", (0,), "int64", maxshape=(None,), chunks=(8192,))
        self.optional: dict[str, h5py.Dataset] = {}  # target, path, data.store keys, texts, token map
        self.tokens = 0  # token rows so far

    def write(self, rec: StepRecord, start: int) -> None:
        """Append one batch's rows; `start` is the number of samples before it."""
        n = len(rec.sample_index)
        append(self.index, rec.sample_index.astype(np.int64, copy=False))
        append(self.step, np.full(n, rec.step, dtype=np.int64))
        if rec.target is not None:
            self._append("target", rec.target, start, chunk_rows=8192)
        if rec.path is not None:
            self._append("path", np.array(rec.path, dtype=object), start)
        for name, arr in (rec.samples or {}).items():
            self._append(name, arr, start, step=rec.step)
        if rec.tokens is not None:  # the token map of `rows: token` captures
            for name, arr in zip(TOKEN_NAMES, rec.tokens, strict=False):
                dtype = "uint8" if name == "token_generated" else "int64"
                self._append(name, np.asarray(arr).astype(dtype, copy=False), self.tokens)
            self.tokens += len(rec.tokens[0])

    def _append(self, name: str, arr: np.ndarray, backfill: int, chunk_rows: int = 4096, step: int = 0) -> None:
        ds = self.optional.get(name)
        if ds is None and arr.dtype == object:  # paths and texts: UTF-8 strings
            ds = self.file["samples"].create_dataset(name, (backfill,), h5py.string_dtype(), maxshape=(None,), chunks=(4096,))
        elif ds is None:
            ds = new_dataset(self.file, f"samples/{name}", arr, self.compression, chunk_rows=chunk_rows, backfill=backfill)
        self.optional[name] = ds
        if arr.shape[1:] != ds.shape[1:]:
            raise RunError(f"/samples/{name}: batch {step} has rows of shape {arr.shape[1:]}, earlier batches "
                           f"{ds.shape[1:]} (pad every sample to one length, e.g. data.padding=max_length)")
        append(ds, arr)

    def mark(self) -> dict:
        """Its state before a batch, for roll_back."""
        sets = [self.index, self.step, *self.optional.values()]
        return {"rows": {d.name: d.shape[0] for d in sets}, "optional": set(self.optional), "tokens": self.tokens}

    def roll_back(self, mark: dict) -> None:
        """Take out what a failed batch wrote: new datasets go, the others get their old length."""
        for name in set(self.optional) - mark["optional"]:
            del self.file[self.optional.pop(name).name]
        self.tokens = mark["tokens"]
        for name, rows in mark["rows"].items():
            if self.file[name].shape[0] != rows:
                self.file[name].resize(rows, axis=0)
