"""The merged view: one captures.h5 whose datasets are HDF5 virtual datasets over the rank files.

    view = build_view(Path("run/captures.h5"), [Path("run/captures.rank-00000.h5"), ...], attrs)
    view.status, view.incomplete  # 'complete', [] once every shard is

No capture row is copied: each capture, /samples/index, /step, /target and /path maps the shards'
rows in rank order (= sample order), by relative file name, so the folder can be moved. A virtual
dataset whose source file is missing reads as zeros without an error in every HDF5 reader, so a
reader must check the sources first: check_sources() does, and open_run and patch call it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from hookrun.errors import HookrunError, RunError

SAMPLE_DATASETS = ("index", "step", "target", "path")
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
                out.attrs["shards"] = np.array([s.name for s in shards], dtype=h5py.string_dtype())
                out.attrs["world_size"] = len(shards)
                out.attrs["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    finally:
        for _, f in opened:
            f.close()
    return View(path, "complete" if not incomplete else "incomplete", incomplete, total, time.perf_counter() - started)


def _write(out: h5py.File, shards: list[tuple[Path, h5py.File]]) -> int:
    """The virtual datasets; returns the number of samples."""
    counts = [f["samples/index"].shape[0] for _, f in shards]
    steps = [len(np.unique(f["samples/step"][:])) for _, f in shards]
    first = shards[0][1] if shards else None
    if first is not None:
        for key in ("format_version", "hookrun_version", "torch_version", "model_class", "mode", "created"):
            if key in first.attrs:
                out.attrs[key] = first.attrs[key]
        out.attrs["device"] = ", ".join(sorted({str(f.attrs.get("device", "?")) for _, f in shards}))
    out.attrs["steps_complete"] = sum(steps)
    out.attrs["samples_complete"] = sum(counts)
    out.attrs["shard_samples"] = np.array(counts, dtype=np.int64)
    samples = out.create_group("samples")
    for name in SAMPLE_DATASETS:
        have = [(p, f, f"samples/{name}", n) for (p, f), n in zip(shards, counts, strict=True) if f"samples/{name}" in f]
        if name in ("index", "step") or have:
            if len(have) != len(shards):
                raise RunError(f"/samples/{name} is in {len(have)} of {len(shards)} shards: they were not written by one config")
            _virtual(samples, name, have)
    out.create_group("captures")
    names: dict[str, None] = {}
    for _, f in shards:
        f["captures"].visititems(lambda n, o: names.setdefault(n) if isinstance(o, h5py.Dataset) and "role" in o.attrs else None)
    all_index = np.concatenate([f["samples/index"][:] for _, f in shards]) if shards else np.zeros(0, np.int64)
    for name in names:
        _capture(out, name, shards, counts, steps, all_index)
    return sum(counts)


def _capture(out: h5py.File, name: str, shards: list[tuple[Path, h5py.File]], counts: list[int], steps: list[int],
             all_index: np.ndarray) -> None:
    """One capture: its rows from each shard in rank order, capped at `limit` where record had one."""
    full = f"captures/{name}"
    parts, index_parts = [], []
    attrs = None
    for (path, f), n_samples, n_steps in zip(shards, counts, steps, strict=True):
        if full not in f:
            continue
        ds = f[full]
        attrs = attrs or dict(ds.attrs)
        per_step = str(ds.attrs["rows"]) == "steps"
        own = ds.parent[ds.attrs["index"]] if ds.attrs.get("index") else None
        rows = min(ds.shape[0], own.shape[0] if own is not None else (n_steps if per_step else n_samples))
        parts.append((path, f, full, rows))
        if own is not None:
            index_parts.append(own[:rows])
        elif per_step:
            first_step = int(f["samples/step"][0]) if f["samples/step"].shape[0] else 0
            index_parts.append(np.arange(first_step, first_step + rows))
        else:
            index_parts.append(f["samples/index"][:rows])
    limit = int(attrs["limit"]) if "limit" in attrs else None
    if limit is not None:  # each rank recorded its first `limit` rows; the run's are the first of all
        parts, index_parts = _cap(parts, limit), _cap_arrays(index_parts, limit)
    ds = _virtual(out, full, parts)
    for key, value in attrs.items():
        ds.attrs[key] = value
    ds.attrs["shard_rows"] = np.array([p[3] for p in parts], dtype=np.int64)
    index = np.concatenate(index_parts) if index_parts else np.zeros(0, np.int64)
    per_step = str(attrs["rows"]) == "steps"
    implicit = np.arange(len(index)) if per_step else all_index[: len(index)]
    if np.array_equal(index, implicit):
        ds.attrs["index"] = ""
    else:  # rows that skip samples or steps: the row index, small and written (not a view)
        leaf = full.rsplit("/", 1)[1] + ".index"
        ds.parent.create_dataset(leaf, data=index.astype(np.int64))
        ds.attrs["index"] = leaf


def _cap(parts: list[tuple], limit: int) -> list[tuple]:
    out, left = [], limit
    for path, f, name, rows in parts:
        take = min(rows, left)
        if take:
            out.append((path, f, name, take))
        left -= take
    return out


def _cap_arrays(arrays: list[np.ndarray], limit: int) -> list[np.ndarray]:
    out, left = [], limit
    for a in arrays:
        if left > 0 and len(a):
            out.append(a[:left])
            left -= len(out[-1])
    return out


def _virtual(group: h5py.Group, name: str, parts: list[tuple[Path, h5py.File, str, int]]) -> h5py.Dataset:
    """A virtual dataset `name` in `group`: the first `rows` rows of each part's dataset, in order."""
    if not parts:
        raise RunError(f"{name}: no shard holds rows of it")
    ref = parts[0][1][parts[0][2]]
    for path, f, src, _ in parts[1:]:
        other = f[src]
        if other.dtype != ref.dtype or other.shape[1:] != ref.shape[1:]:
            raise RunError(f"{src}: {path.name} has rows of {other.dtype} {other.shape[1:]}, "
                           f"{parts[0][0].name} of {ref.dtype} {ref.shape[1:]}: the ranks did not capture the same thing")
    total = sum(p[3] for p in parts)
    layout = h5py.VirtualLayout(shape=(total, *ref.shape[1:]), dtype=ref.dtype)
    at = 0
    for path, _, src, rows in parts:
        if rows:
            source = h5py.VirtualSource(path.name, src, shape=(rows, *ref.shape[1:]), dtype=ref.dtype)
            layout[at : at + rows] = source
        at += rows
    return group.create_virtual_dataset(name, layout)


def check_sources(f: h5py.File, path: Path) -> None:
    """Refuse a view whose shard files are not all there: HDF5 would read their rows as zeros."""
    shards = f.attrs.get("shards")
    if shards is None:
        return
    names = [s.decode() if isinstance(s, bytes) else str(s) for s in shards]
    missing = [n for n in names if not (path.parent / n).is_file()]
    if missing:
        raise HookrunError(
            f"{path} is a view over {len(names)} shard files and {len(missing)} of them are missing from "
            f"{path.parent}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; keep the "
            f"captures.rank-*.h5 files beside it (HDF5 would read their rows as zeros)"
        )
