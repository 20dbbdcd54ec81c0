"""`evaluate`'s table: one row per batch under /evaluation, the run's totals as attributes.

    ev = EvaluationStore(h5file)
    ev.write(step, row)      # an EvaluationRow (below): appended at once, like a capture
    ev.flush()               # the latest totals (and splice states) reach the attributes
    rows, state = read_evaluation(h5file)   # resume: the rows of each batch, the states of the last flush

    /evaluation                      attrs: ablation, modules (the intervened modules), mean
    /evaluation/step                 (batches,) int64: the batch number of each row
    /evaluation/model/METRIC         (batches,) float64: ce_clean, ce_intervened, kl_intervened, ...,
                                     ce_count, kl_count; the group's attrs: the run's totals by METRIC
    /evaluation/splices/MODULE/METRIC  (batches,) float64 per spliced module (l0, mse, ...); attrs:
                                     `module` and the module's run totals by METRIC
    /evaluation/splices/MODULE/state/NAME   the splice statistics' state at the last flush (resume)

The store writes it as a table a kind hands it (store/records.py: StepRecord.tables["evaluation"]),
registered below. The totals are written at each flush with the counts, so a killed file's totals are those of the
batches it holds. docs/format.md describes the layout for readers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from hookrun.store import allocated
from hookrun.store.columns import append
from hookrun.store.kind_tables import KindTable, register_table
from hookrun.store.overhead import dataset_bytes, table_bytes
from hookrun.store.records import escape

GROUP = "evaluation"
CHUNK_ROWS = 1024


@dataclass
class EvaluationRow:
    """One batch's `evaluate` metrics (kind.py), written under /evaluation."""

    model: dict[str, float]  # ce_clean, ce_intervened, kl_intervened, ... and the counts ce_count, kl_count
    splices: dict[str, dict[str, float]] = field(default_factory=dict)  # spliced module -> its metrics this batch
    totals: dict[str, dict[str, float]] | None = None  # the run's totals after this batch: "" the model's, else a module's
    state: dict[str, dict[str, np.ndarray]] | None = None  # spliced module -> its statistics' state (resume)
    attrs: dict[str, Any] = field(default_factory=dict)  # /evaluation's attributes (ablation, modules)


def evaluation_bytes(batches: int, metrics: int, splices: list[tuple[int, list[int]]]) -> int:
    """What /evaluation adds to a file of `batches` batches (the dry-run estimate): `step` and the
    model's `metrics` columns, each spliced module's (metrics, [its state arrays' bytes]), in whole
    chunks of CHUNK_ROWS rows, with their object headers, the groups and the totals' attributes."""
    columns = 1 + metrics + sum(m for m, _ in splices)
    chunks = -(-batches // CHUNK_ROWS)
    states = [b for _, arrays in splices for b in arrays]
    groups = 2 + 3 * len(splices)  # /evaluation, model; splices, splices/MODULE, its state
    attrs = 5 + metrics + sum(m + 1 for m, _ in splices)  # (the totals: a float64 each)
    return (columns * allocated(batches, CHUNK_ROWS) * 8 + sum(states) + dataset_bytes([(1, chunks, False)] * columns)
            + table_bytes(groups, len(states), attrs, 8 * attrs))  # (states: contiguous)


class EvaluationStore:
    def __init__(self, file: h5py.File) -> None:
        self.file = file
        self.latest: EvaluationRow | None = None  # the last row with totals (written at flush)
        self.latest_rows = 0  # rows when it was written

    @property
    def rows(self) -> int:
        return self.file[f"{GROUP}/step"].shape[0] if f"{GROUP}/step" in self.file else 0

    def write(self, step: int, row: EvaluationRow) -> None:
        """Append one batch's row; a metric missing from it is NaN, a new one is NaN before it."""
        g = self.file.get(GROUP)
        if g is None:
            g = self.file.create_group(GROUP)
            for key, value in row.attrs.items():
                g.attrs[key] = json.dumps(value) if isinstance(value, list | dict) else ("" if value is None else value)
        n = self.rows
        self._append(g, "step", np.int64(step), n, np.int64)
        self._append_all(g.require_group("model"), row.model, n)
        for module, values in row.splices.items():
            sg = g.require_group(f"splices/{escape(module)}")
            sg.attrs["module"] = module
            self._append_all(sg, values, n)
        if row.totals is not None:
            self.latest, self.latest_rows = row, n + 1

    def _append_all(self, group: h5py.Group, values: Mapping[str, float], n: int) -> None:
        for name, value in values.items():  # counts (ints) as int64, metrics as float64
            self._append(group, name, value, n, np.int64 if isinstance(value, int | np.integer) else np.float64)
        for ds in group.values():  # a metric this row lacks
            if isinstance(ds, h5py.Dataset) and ds.shape[0] == n:
                append(ds, np.full(1, np.nan if ds.dtype.kind == "f" else 0, dtype=ds.dtype))

    def _append(self, group: h5py.Group, name: str, value: float, n: int, dtype=np.float64) -> None:
        ds = group.get(name)
        if ds is None:
            ds = group.create_dataset(name, shape=(n,), dtype=dtype, maxshape=(None,), chunks=(CHUNK_ROWS,),
                                      fillvalue=np.nan if dtype is np.float64 else 0)
        append(ds, np.asarray([value], dtype=dtype))

    def mark(self) -> dict:
        """Every dataset's rows before a batch (roll_back restores them)."""
        if GROUP not in self.file:
            return {}
        out = {}
        self.file[GROUP].visititems(lambda name, obj: out.__setitem__(obj.name, obj.shape[0])
                                    if isinstance(obj, h5py.Dataset) and "/state/" not in obj.name else None)
        return out

    def roll_back(self, mark: dict) -> None:
        if GROUP not in self.file:
            return
        if not mark:  # the group was made by the failed batch
            del self.file[GROUP]
            return
        found = []
        self.file[GROUP].visititems(lambda name, obj: found.append(obj.name)
                                    if isinstance(obj, h5py.Dataset) and "/state/" not in obj.name else None)
        for name in found:
            if name not in mark:
                del self.file[name]
            elif self.file[name].shape[0] != mark[name]:
                self.file[name].resize(mark[name], axis=0)
        if self.latest is not None and self.latest_rows > self.rows:
            self.latest = None

    def flush(self) -> None:
        """The latest totals as attributes, and the splice states (written once per flush)."""
        row = self.latest
        if row is None or GROUP not in self.file:
            return
        g = self.file[GROUP]
        g.attrs["totals_rows"] = self.latest_rows  # the rows the totals cover
        for key, values in (row.totals or {}).items():
            group = g.require_group("model" if key == "" else f"splices/{escape(key)}")
            for name, value in values.items():
                group.attrs[name] = value if isinstance(value, int | np.integer) else float(value)
        for module, state in (row.state or {}).items():
            sg = g.require_group(f"splices/{escape(module)}")
            if "state" in sg:
                del sg["state"]
            st = sg.create_group("state")
            st.attrs["rows"] = self.latest_rows
            for name, value in state.items():
                st.create_dataset(name, data=np.asarray(value))
        self.latest = None


def read_rows(f: h5py.File, rows: int | None = None) -> dict[int, EvaluationRow]:
    """The first `rows` batches' rows by batch number (resume's replay)."""
    return read_evaluation(f, rows)[0]


def read_evaluation(f: h5py.File, rows: int | None = None) -> tuple[dict[int, EvaluationRow], dict]:
    """The rows of a file's /evaluation by batch number (the first `rows` of them), with the file's
    totals and states on the last one where they cover exactly those rows; and the states by module."""
    if GROUP not in f:
        return {}, {}
    g = f[GROUP]
    steps = g["step"][:rows]
    attrs = {k: _attr(v) for k, v in g.attrs.items() if k != "totals_rows"}
    model = {k: ds[:rows] for k, ds in g["model"].items() if isinstance(ds, h5py.Dataset)}
    splices = {}
    states, totals = {}, {"": {k: v.item() for k, v in g["model"].attrs.items()}}
    for sg in (g["splices"].values() if "splices" in g else ()):
        module = str(sg.attrs["module"])
        splices[module] = {k: ds[:rows] for k, ds in sg.items() if isinstance(ds, h5py.Dataset)}
        totals[module] = {k: v.item() for k, v in sg.attrs.items() if k != "module"}
        if "state" in sg and int(sg["state"].attrs["rows"]) == len(steps):
            states[module] = {k: ds[()] for k, ds in sg["state"].items()}
    out = {}
    for i, step in enumerate(steps.tolist()):
        out[step] = EvaluationRow({k: v[i].item() for k, v in model.items() if not np.isnan(v[i])},
                                  {m: {k: float(v[i]) for k, v in d.items() if not np.isnan(v[i])} for m, d in splices.items()},
                                  attrs=attrs)
    if out and int(g.attrs.get("totals_rows", -1)) == len(steps):
        last = out[int(steps[-1])]
        last.totals, last.state = totals, states or None
    return out, states


def _attr(value):
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value.item() if isinstance(value, np.generic) else value


TABLE = register_table(KindTable(GROUP, EvaluationStore, read_rows))
