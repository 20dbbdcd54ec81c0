"""The merged view: one captures.h5 whose datasets are HDF5 virtual datasets over the rank files.

    view = build_view(Path("run/captures.h5"), [Path("run/captures.rank-00000.h5"), ...], attrs)
    view.status, view.incomplete  # 'complete', [] once every shard is

No capture row is copied: each capture, /samples/index, /step, /target and /path maps the shards'
rows in rank order (= sample order), by relative file name, so the folder can be moved; the run's
root attributes (versions, model, mode, `kind` and the attribute named by it: a kind's own, e.g. a grid layout) are rank 0's (model_fingerprint: every shard's). A virtual
dataset whose source file is missing reads as zeros without an error in every HDF5 reader, so a
reader must check the sources first: store/view_sources.py's check_sources() does, and open_run and patch call it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from hookrun.error_words import refused_write, write_reason
from hookrun.errors import HookrunError, RunError
from hookrun.store import CaptureMeta, RowKind
from hookrun.store.listing import is_capture
from hookrun.store.live import settled
from hookrun.store.run_state import copy_whole, merge_features

SAMPLE_DATASETS = ("index", "step", "target", "path")  # then every other /samples dataset (token map, data.store keys)
FINAL = ("complete", "failed", "interrupted")


@dataclass
class View:
    path: Path
    status: str
    incomplete: list[str] = field(default_factory=list)  # 'captures.rank-00001.h5 (failed)', ...
    samples: int = 0
    seconds: float = 0.0


def shard_status(path: Path) -> str:
    """A shard file's status attribute; 'missing' or 'unreadable' where it cannot be read."""
    if not path.is_file():
        return "missing"
    try:
        with h5py.File(path, "r", locking=False) as f:
            return str(f.attrs.get("status", "unreadable"))
    except (OSError, KeyError):
        return "unreadable"


def build_view(path: Path, shards: list[Path], attrs: dict) -> View:
    """Write `path` as a view over `shards` (in rank order), in a temporary file renamed into place.
    Shards that are missing or unreadable are left out and named in `incomplete_shards`."""
    started = time.perf_counter()
    folder = path.parent
    opened: list[tuple[Path, h5py.File]] = []
    incomplete: list[str] = []
    try:
        for shard in shards:
            if shard.parent.resolve() != folder.resolve():
                raise RunError(f"shard {shard} is not in the view's folder {folder}")
            settled(shard)  # a killed rank's flush helper: its last message written
            status = shard_status(shard)
            if status in ("missing", "unreadable"):
                incomplete.append(f"{shard.name} ({status})")
                continue
            f = h5py.File(shard, "r", locking=False)
            opened.append((shard, f))
            if status != "complete":
                incomplete.append(f"{shard.name} ({status}, {int(f.attrs.get('steps_complete', 0))} batches)")
        tmp = path.with_name(path.name + ".view-tmp")
        try:
            with h5py.File(tmp, "w") as out:
                total = _write(out, opened)
                for key, value in attrs.items():
                    out.attrs[key] = value
                out.attrs["status"] = "complete" if not incomplete else "incomplete"
                out.attrs["incomplete_shards"] = ", ".join(incomplete)
                # the files the view reads (a missing shard is named in incomplete_shards only)
                out.attrs["shards"] = np.array([p.name for p, _ in opened], dtype=h5py.string_dtype())
                out.attrs["world_size"] = len(shards)
                out.attrs["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            os.replace(tmp, path)
        except BaseException as exc:  # (an old view goes too: the shards it read were written again, it reads them as zeros)
            tmp.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            if isinstance(exc, HookrunError) or not refused_write(exc):
                raise
            raise RunError(f"writing the merged view {path} failed: {write_reason(exc)}; the shards are as their ranks "
                           f"wrote them: free some space there and write it again (a run: the same command with "
                           f"resume=true; a reader: open it again)") from None
    finally:
        for _, f in opened:
            f.close()
    return View(path, "complete" if not incomplete else "incomplete", incomplete, total, time.perf_counter() - started)


@dataclass
class _Shard:
    """What the view needs of one shard, read once: h5py calls cost about as much as the mapping."""

    path: Path
    file: h5py.File
    index: np.ndarray  # /samples/index
    first_step: int
    steps: int
    captures: dict[str, h5py.Dataset]  # by path under /captures

    @classmethod
    def read(cls, path: Path, f: h5py.File) -> _Shard:
        index = f["samples/index"][:]
        step = f["samples/step"][:]
        found: dict[str, h5py.Dataset] = {}

        def visit(name: str, obj: object) -> None:  # (a value returned would stop visititems)
            if is_capture(obj):
                found[name] = obj

        if "captures" in f:  # (a kind's run with no hook that records: a probe run's shards)
            f["captures"].visititems(visit)
        return cls(path, f, index, int(step[0]) if len(step) else 0, len(np.unique(step)), found)


def _write(out: h5py.File, opened: list[tuple[Path, h5py.File]]) -> int:
    """The virtual datasets; returns the number of samples."""
    shards = [_Shard.read(path, f) for path, f in opened]
    counts = [len(s.index) for s in shards]
    if shards:
        first = shards[0].file.attrs
        kind = str(first.get("kind", ""))  # the file's kind; its root attribute of that name is its reader's
        for key in ("format_version", "hookrun_version", "torch_version", "model_class", "mode", "created", "kind", "class_names", "input_normalize",
                    *((kind,) if kind else ())):
            if key in first:
                out.attrs[key] = first[key]
        out.attrs["device"] = ", ".join(sorted({str(s.file.attrs.get("device", "?")) for s in shards}))
        _one_model(out, shards)
        if all("hooks_not_fired" in s.file.attrs for s in shards):  # not fired on any rank; skipped on some
            silent = [set(filter(None, str(s.file.attrs["hooks_not_fired"]).split(", "))) for s in shards]
            out.attrs["hooks_not_fired"] = ", ".join(sorted(set.intersection(*silent)))
            out.attrs["hooks_skipped"] = "; ".join(sorted({p for s in shards for p in
                                                           str(s.file.attrs.get("hooks_skipped", "")).split("; ") if p}))
    out.attrs["steps_complete"] = sum(s.steps for s in shards)
    out.attrs["samples_complete"] = sum(counts)
    out.attrs["shard_samples"] = np.array(counts, dtype=np.int64)
    # each shard's `created`: a reader tells a shard written again after the view (view_sources.check_shards)
    out.attrs["shard_created"] = np.array([str(s.file.attrs.get("created", "")) for s in shards], dtype=h5py.string_dtype())
    samples = out.create_group("samples")
    others = list(dict.fromkeys(n for s in shards for n in s.file["samples"] if n not in SAMPLE_DATASETS))
    for name in (*SAMPLE_DATASETS, *others):
        have = [(s.path, s.file[f"samples/{name}"], f"samples/{name}",
                 s.file[f"samples/{name}"].shape[0] if name.startswith("token_") else n)  # token rows, or samples
                for s, n in zip(shards, counts, strict=True) if name in s.file["samples"]]
        # a shard killed before its first batch has no optional column yet: it holds no row of it either
        due = sum(1 for s, n in zip(shards, counts, strict=True) if n or name in s.file["samples"])
        if name in others and (len(have) != due or len({(h[1].dtype, h[1].shape[1:]) for h in have}) > 1):
            continue  # a data.store key padded to different lengths per shard: left out of the view
        if name in ("index", "step") or have:
            if len(have) != due:
                raise RunError(f"/samples/{name} is in {len(have)} of {due} shards ({', '.join(h[0].name for h in have)}): " + (
                    "their items differ: every item must give a target, or none does (data.target=null)" if name == "target" else "they were not written by one config"))
            _virtual(samples, name, have)
    out.create_group("captures")
    names = dict.fromkeys(name for s in shards for name in s.captures)
    all_index = np.concatenate([s.index for s in shards]) if shards else np.zeros(0, np.int64)
    for name in names:
        if str(next(s.captures[name] for s in shards if name in s.captures).attrs["rows"]) != RowKind.FEATURES.value:
            _capture(out, name, shards, all_index)
    merge_features(out, [s.file for s in shards])  # end-of-run captures: merged, not concatenated
    copy_whole(out, [s.file for s in shards])  # a kind's result for the whole run, written by one rank
    return sum(counts)


def _one_model(out: h5py.File, shards: list[_Shard]) -> None:
    """The shards' `model_fingerprint`, the view's (sae.evaluate's weight check reads it); shards written by
    other weights are not one run: refused, naming them."""
    prints = {s.path.name: str(s.file.attrs["model_fingerprint"]) for s in shards if "model_fingerprint" in s.file.attrs}
    (first, mine), *rest = prints.items() if prints else [(None, None)]
    other = next(((name, theirs) for name, theirs in rest if theirs != mine), None)
    if other is not None:
        raise RunError(f"{other[0]} was written by a model with other weights than {first} (model_fingerprint {other[1]}, "
                       f"not {mine}): the shards are not one run; run every rank again with the same model")
    if mine is not None:
        out.attrs["model_fingerprint"] = mine


def _capture(out: h5py.File, name: str, shards: list[_Shard], all_index: np.ndarray) -> None:
    """One capture: its rows from each shard in rank order, capped at `limit` where record had one."""
    full = f"captures/{name}"
    parts, index_parts = [], []
    attrs = meta = None
    for s in shards:
        ds = s.captures.get(name)
        if ds is None:
            continue
        if meta is None:
            attrs, meta = dict(ds.attrs), CaptureMeta.from_attrs(ds.attrs)
        per_step = meta.rows is RowKind.STEPS
        own_name = meta.index if not parts else ds.attrs["index"]  # the first shard's attrs are read already
        own = ds.parent[own_name] if own_name else None
        if meta.rows is RowKind.TOKENS:  # one row per token: as many as the shard's token map
            rows = min(ds.shape[0], s.file["samples/token_sample"].shape[0])
        else:
            rows = min(ds.shape[0], own.shape[0] if own is not None else (s.steps if per_step else len(s.index)))
        parts.append((s.path, ds, full, rows))
        if meta.rows is RowKind.TOKENS:
            continue  # rows are indexed by the view's /samples/token_sample
        if own is not None:
            index_parts.append(own[:rows])
        elif per_step:
            index_parts.append(np.arange(s.first_step, s.first_step + rows))
        else:
            index_parts.append(s.index[:rows])
    limit = int(meta.extra["limit"]) if "limit" in meta.extra else None
    if limit is not None:  # each rank recorded its first `limit` rows; the run's are the first of all
        parts, index_parts = _cap(parts, limit), _cap_arrays(index_parts, limit)
    view = _virtual(out, full, parts)
    for key, value in attrs.items():
        view.attrs[key] = value
    for count in ("overflow_values", "underflow_values"):  # the run's: every shard's (the first's alone undercounts;
        # with `limit`, a shard's rows past the view's cap are counted too)
        if total := sum(int(s.captures[name].attrs.get(count, 0)) for s in shards if name in s.captures):
            view.attrs[count] = total
    view.attrs["digest"] = ""  # the checksums stay in the shards (inspect --verify a shard file)
    view.attrs["shard_rows"] = np.array([p[3] for p in parts], dtype=np.int64)
    index = np.concatenate(index_parts) if index_parts else np.zeros(0, np.int64)
    implicit = np.arange(len(index)) if meta.rows is RowKind.STEPS else all_index[: len(index)]
    if meta.rows is RowKind.TOKENS or np.array_equal(index, implicit):
        view.attrs["index"] = ""
    else:  # rows that skip samples or steps: the row index, small and written (not a view)
        leaf = full.rsplit("/", 1)[1] + ".index"
        view.parent.create_dataset(leaf, data=index.astype(np.int64))
        view.attrs["index"] = leaf


def _cap(parts: list[tuple], limit: int) -> list[tuple]:
    out, left = [], limit
    for path, ds, name, rows in parts:
        take = min(rows, left)
        if take:
            out.append((path, ds, name, take))
        left -= take
    return out


def _cap_arrays(arrays: list[np.ndarray], limit: int) -> list[np.ndarray]:
    out, left = [], limit
    for a in arrays:
        if left > 0 and len(a):
            out.append(a[:left])
            left -= len(out[-1])
    return out


def _virtual(group: h5py.Group, name: str, parts: list[tuple[Path, h5py.Dataset, str, int]]) -> h5py.Dataset:
    """A virtual dataset `name` in `group`: the first `rows` rows of each part's dataset, in order."""
    if not parts:
        raise RunError(f"{name}: no shard holds rows of it")
    ref = parts[0][1]
    dtype, row = ref.dtype, ref.shape[1:]
    for path, ds, src, _ in parts[1:]:
        if ds.dtype != dtype or ds.shape[1:] != row:
            raise RunError(f"{src}: {path.name} has rows of {ds.dtype} {ds.shape[1:]}, "
                           f"{parts[0][0].name} of {dtype} {row}: the ranks did not capture the same thing")
    total = sum(p[3] for p in parts)
    layout = h5py.VirtualLayout(shape=(total, *row), dtype=dtype)
    at = 0
    for path, ds, src, rows in parts:
        if rows:
            # `%` in a source's names is a format specifier to HDF5 (a%2Fb needs %%). The source's real shape,
            # its first `rows` selected: declared `rows` long over more rows, a whole read of the view failed
            source = h5py.VirtualSource(path.name.replace("%", "%%"), src.replace("%", "%%"), shape=ds.shape, dtype=dtype)
            layout[at : at + rows] = source[:rows]
        at += rows
    return group.create_virtual_dataset(name, layout)
