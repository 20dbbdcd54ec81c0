"""Run state in the file: actions' state saved at each flush (resume), and their end-of-run arrays.

    states = RunState()
    states.keep(steps, {"hooks.top.actions.0@h.3": {"values": arr, ...}})  # after each batch
    states.flush(h5file, steps)         # at each flush, inside the store's one HDF5 flush
    read_state(h5file, steps)           # resume: the states saved with exactly `steps` batches
    write_features(h5file, captures)    # the end of a complete run: one row per feature
    merge_features(view, shard_files)   # a many-rank view: top-k of the ranks' top-k

    /state/KEY/{a,b}/NAME               an action's state (attrs: steps, the batches it covers; key),
                                        the two slots written in turn, in place: the other slot
                                        keeps the flush before, so a file killed inside a flush
                                        still has the state of the batches it recovers.
    /captures/HOOK/MODULE/top.values    a features capture (rows = "features"): written once

The store hands these arrays on; it knows nothing of the actions that made them. A features
capture carries its merge rule in its attributes (`merge: top_k`, `merge_order`): the view of a
many-rank run sorts the ranks' rows by the first capture named there (descending), then by the
others (ascending), and keeps the first `k` per row.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np
import torch

from hookrun.store import CaptureMeta, RowKind
from hookrun.store.listing import is_capture
from hookrun.store.records import Capture, escape

GROUP = "state"
SLOTS = ("a", "b")


def as_array(value: Any) -> np.ndarray:
    return value.numpy(force=True) if isinstance(value, torch.Tensor) else np.asarray(value)


class RunState:
    """The latest state snapshot handed to the store, written at the next flush."""

    def __init__(self) -> None:
        self.latest: dict[str, dict[str, Any]] | None = None
        self.steps = -1  # the batches the latest snapshot covers

    def keep(self, steps: int, state: dict[str, dict[str, Any]] | None) -> None:
        if state:
            self.latest, self.steps = state, steps

    def flush(self, f: h5py.File, steps: int) -> None:
        """Write the latest snapshot where it covers exactly `steps` batches (else nothing: a
        snapshot of other batches would not match the rows)."""
        if self.latest is None or self.steps != steps:
            return
        root = f.require_group(GROUP)
        for key, arrays in self.latest.items():
            g = root.require_group(escape(key))
            # two slots, written in turn: the other keeps the flush before (a kill inside this one)
            slot = min(SLOTS, key=lambda n: int(g[n].attrs.get("steps", -1)) if n in g else -2)
            snap = g.require_group(slot)
            snap.attrs["steps"], snap.attrs["key"] = -1, key  # not whole until the arrays are in
            for k, v in arrays.items():
                a = as_array(v)
                ds = snap.get(k)
                if ds is not None and (ds.shape != a.shape or ds.dtype != a.dtype):
                    del snap[k]
                    ds = None
                if ds is None:
                    snap.create_dataset(k, data=a)
                else:
                    ds[...] = a  # in place: a run's many flushes do not grow the file
            snap.attrs["steps"] = steps
        self.latest = None


def read_state(f: h5py.File, steps: int) -> dict[str, dict[str, np.ndarray]]:
    """Each action's state saved with exactly `steps` batches (by key); {} where none was."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for g in (f[GROUP].values() if GROUP in f else ()):
        for snap in g.values():
            if int(snap.attrs.get("steps", -1)) == steps:
                out[str(snap.attrs["key"])] = {k: ds[()] for k, ds in snap.items()}
    return out


def write_features(f: h5py.File, captures: list[Capture]) -> None:
    """End-of-run captures, one row per feature, each written whole."""
    for cap in captures:
        arr = as_array(cap.value)
        path = cap.key.path
        if path in f:
            del f[path]
        ds = f.create_dataset(path, data=arr)
        ds.attrs.update(CaptureMeta.of(cap, arr.shape[1:]).to_attrs())


def merge_features(out: h5py.File, files: list[h5py.File]) -> None:
    """The features captures of a many-rank run in its view: each group (same hook, module, call and
    merge rule) merged as its `merge` attribute says (top_k: the k first rows of the ranks' rows
    sorted by `merge_order`), written as real data."""
    groups: dict[tuple, dict[str, list[h5py.Dataset]]] = {}
    for f in files:
        def visit(name: str, obj: Any, f: h5py.File = f) -> None:
            if is_capture(obj) and str(obj.attrs.get("rows")) == RowKind.FEATURES.value:
                m = CaptureMeta.from_attrs(obj.attrs)
                groups.setdefault((m.hook, m.module, m.call, obj.parent.name), {}).setdefault(m.role, []).append(obj)
        if "captures" in f:
            f["captures"].visititems(visit)
    for (_, _, _, parent), roles in groups.items():
        first = next(iter(roles.values()))[0]
        order = str(first.attrs.get("merge_order", "")).split(",")
        if first.attrs.get("merge") != "top_k" or not all(r in roles for r in order):
            continue
        k = int(first.attrs["k"])
        parts = {r: np.concatenate([ds[()] for ds in roles[r]], axis=1) for r in roles}
        merged = top_k_rows(parts, order, k)
        for role, dss in roles.items():
            ds = out.create_dataset(f"{parent}/{role}", data=merged[role])
            ds.attrs.update({key: v for key, v in dss[0].attrs.items()})
            ds.attrs["digest"] = ""  # merged rows: the checksums stay in the shards (as store/merge.py's views)


def copy_whole(out: h5py.File, files: list[h5py.File]) -> None:
    """What a kind wrote once for the whole run on the rank that merged every rank's statistics (a
    probe run's /probe, marked `whole`; a similarity run's matrix, a features capture without a
    merge rule that one shard alone holds): copied into the view as it is."""
    for f in files:
        for name, obj in f.items():
            if isinstance(obj, h5py.Group) and obj.attrs.get("whole") and name not in out:
                f.copy(obj, out, name=name)
    found: dict[str, list[h5py.File]] = {}
    for f in files:
        def visit(name: str, obj: Any, f: h5py.File = f) -> None:
            if is_capture(obj) and str(obj.attrs.get("rows")) == RowKind.FEATURES.value and not obj.attrs.get("merge"):
                found.setdefault(obj.name, []).append(f)
        if "captures" in f:
            f["captures"].visititems(visit)
    for name, holders in found.items():
        if len(holders) == 1 and name not in out:
            out.require_group(name.rsplit("/", 1)[0])
            holders[0].copy(holders[0][name], out, name=name)
            out[name].attrs["digest"] = ""  # its checksums stay in its shard (the view has no table)


def top_k_rows(parts: dict[str, np.ndarray], order: list[str], k: int) -> dict[str, np.ndarray]:
    """Per row, the k first columns sorted by order[0] descending (NaN last), then the others
    ascending; every array of `parts` (rows x columns) taken in that order."""
    key = parts[order[0]].astype(np.float64)
    key = np.where(np.isnan(key), -np.inf, key)
    empty = np.isnan(parts[order[0]].astype(np.float64))
    # np.lexsort sorts by the last key first: empty slots last, then -value, then the others
    keys = [parts[r] for r in reversed(order[1:])] + [-key, empty]
    idx = np.lexsort(keys, axis=-1)[:, :k]
    return {r: np.take_along_axis(a, idx, axis=1) for r, a in parts.items()}
