"""Resume: continue an interrupted or killed run from its last complete batch.

    state = open_resume(path, cfg_yaml)      # refuses a config that would change the captures
    steps = state.replay(store)              # the old batches, written again through the store
    # ... the loop then runs from batch `steps` on; the new file replaces the old one at the end

The old file is only read: its complete batches are written again, batch by batch, into a new
file through the same writer code, so the result equals an uninterrupted run's captures bit for
bit. Until the new file is closed, the old one stays where it was: nothing is lost on a second
failure. Both kinds of old run satisfy Resume: ResumeState (one local file, or one rank's shard)
and PartsResume (an object-store run, output/objects/destination.py: its verified parts are kept as they
are, and the part being written when it stopped is replayed). The destination
(output/__init__.py) opens the right one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import h5py
import numpy as np
import torch
import yaml

from hookrun.config.build import same_weights
from hookrun.config.differing import config_differences
from hookrun.errors import ConfigError, HookrunError
from hookrun.store import CaptureMeta, RowKind
from hookrun.store.kind_tables import tables_in
from hookrun.store.listing import damage, list_captures
from hookrun.store.paths import flushing_path
from hookrun.store.reading import LocalSource
from hookrun.store.records import Capture, CaptureKey, RunStore, StepRecord
from hookrun.store.verify import check_block, sample_map_damage, table_of

SAMPLE_KEYS = {"index", "step", "target", "path", "token_sample", "token_position", "token_generated"}


class Resume(Protocol):
    """An old run to continue: what the runner reads from it, whatever holds it."""

    status: str  # the old run's: complete (nothing to do), interrupted, failed, running (killed)

    @property
    def steps(self) -> int:
        """Complete batches kept."""

    @property
    def attrs(self) -> Mapping:
        """The old run's root attributes (hooks_not_fired, ...)."""

    @property
    def file(self) -> h5py.File | None:
        """The old file (a kind restores its totals from its tables); None where there is none."""

    def replay(self, store: RunStore) -> int:
        """Write the kept batches into `store`, in order; returns how many."""

    def close(self) -> None: ...


@dataclass
class ResumeState:
    path: Path
    file: h5py.File
    steps: int  # complete batches in the old file
    status: str
    first_step: int = 0  # the step of its first batch (0, or where a rank's shard starts)

    @property
    def attrs(self) -> Mapping:
        return self.file.attrs

    def replay(self, store: RunStore) -> int:
        return replay_file(self, store)

    def close(self) -> None:
        self.file.close()


def open_resume(path: Path, config_yaml: str) -> ResumeState | None:
    """The old run to continue, None where there is none; ConfigError where it cannot be. A file
    killed inside a flush (left at `<name>.flushing`) gives the batches of the flush before it."""
    source, mid_flush = path, False
    if not path.exists():
        if not flushing_path(path).exists():
            return None
        source, mid_flush = flushing_path(path), True
    try:
        f = LocalSource(source, wait=False).file
    except HookrunError as exc:
        raise ConfigError(f"resume: {str(path)!r} cannot be opened ({exc}); move it away to start again") from None
    if "config" not in f.attrs:
        f.close()
        raise ConfigError(f"resume: {str(path)!r} is not a hookrun file")
    if changed := config_differences(yaml.safe_load(f.attrs["config"]), yaml.safe_load(config_yaml)):
        f.close()
        raise ConfigError(f"resume: the config differs from the one {str(path)!r} was written with, in "
                          f"{', '.join(changed)}; resume with the same settings (or start a new run)")
    if damaged := sample_map_damage(f):  # (copied as they are into the new file, whose checksums would vouch for them)
        f.close()
        raise ConfigError(f"resume: {str(path)!r}: {damaged[0]}: the file was damaged on disk; move it away and run again "
                          f"(python -m hookrun.inspect --verify FILE lists every damaged block)")
    try:
        step_of_row = f["samples/step"][:]
    except READ_ERRORS as exc:
        f.close()
        raise _damaged(path, "/samples/step", exc) from None
    first = int(step_of_row[0]) if len(step_of_row) else 0  # a rank's shard starts at its first batch
    return ResumeState(path, f, complete_steps(f, mid_flush), "running" if mid_flush else str(f.attrs["status"]), first)


def check_same_model(old: Mapping, new: Mapping, where: object) -> None:
    """The new run's model has the old run's weights (`model_fingerprint`, computed once by prepare()) and runs
    on the same kind of device (device=auto on a machine that now has no GPU): else one file would hold two
    networks' rows, or rows not bit for bit those of an uninterrupted run. A file without one (older) passes."""
    theirs, mine = (str(a.get("model_fingerprint") or "") for a in (old, new))
    if theirs and mine and not same_weights(theirs, mine):
        raise ConfigError(f"resume: the model's weights differ from those {str(where)!r} was written with (model_fingerprint "
                          f"{theirs}, now {mine}); resume with the same weights (model.checkpoint, seed), or start a new run")
    was, now = (str(a.get("device") or "").split(":")[0].strip() for a in (old, new))
    if was and now and was != now:
        raise ConfigError(f"resume: {str(where)!r} was written on {old['device']} and this run is on {new['device']}: its "
                          f"rows would not be those of one run; resume on {was} (device={was}), or start a new run")


def complete_steps(f: h5py.File, mid_flush: bool = False) -> int:
    """Batches complete in every dataset: those of /samples/step, but no more than the file's
    `steps_complete`, so a batch that failed part-way (or came after the last flush) is redone.
    In a file killed inside a flush only the flush before that one is sure: `previous_flush`
    (written with the counts, so old or new it names batches every dataset holds)."""
    steps = len(np.unique(f["samples/step"][:]))
    if mid_flush:
        return min(steps, int(f.attrs["previous_flush"][0]) if "previous_flush" in f.attrs else 0)
    return min(steps, int(f.attrs.get("steps_complete", steps)))


def replay_file(state: ResumeState, store: RunStore) -> int:
    """One old file's complete batches, written again through `store`."""
    f = state.file
    try:
        return _replay(state, store, f)
    except _Unreadable as exc:
        raise _damaged(state.path, exc.args[0], exc.__cause__) from None


class _Unreadable(Exception):
    """An old file's object (named in args[0]) that HDF5 could not read (the cause)."""


READ_ERRORS = (KeyError, OSError, RuntimeError, ValueError)  # what h5py raises for a damaged header or chunk


def _damaged(path: Path, what: str, exc: BaseException | None) -> ConfigError:
    return ConfigError(f"resume: {str(path)!r}: {what} cannot be read: the file is damaged ({damage(exc) if exc else '?'}); "
                       f"move it away and run again (python -m hookrun.inspect --verify FILE names what is damaged)")


def _read(what: str, read):
    """read(), or _Unreadable naming `what` where HDF5 cannot."""
    try:
        return read()
    except READ_ERRORS as exc:
        raise _Unreadable(what) from exc


def _captures(path: Path, f: h5py.File) -> list:
    try:
        return list_captures(f)
    except HookrunError as exc:  # a damaged object header, named by list_captures
        raise ConfigError(f"resume: {str(path)!r}: {exc}; move it away and run again") from None


def _replay(state: ResumeState, store: RunStore, f: h5py.File) -> int:
    index = _read("/samples/index", lambda: f["samples/index"][:])
    step_of_row = _read("/samples/step", lambda: f["samples/step"][:])
    target = f["samples/target"] if "target" in f["samples"] else None
    paths = f["samples/path"] if "path" in f["samples"] else None
    extra = {k: f["samples"][k] for k in f["samples"] if k not in SAMPLE_KEYS}  # data.store keys
    steps = state.first_step + np.arange(state.steps + 1)  # a rank's shard starts at its first batch
    tokens = token_step = None
    if "token_sample" in f["samples"]:  # rows: token: the step of each token row, via its sample
        step_of = dict(zip(index.tolist(), step_of_row.tolist(), strict=True))
        token_sample, token_position = f["samples/token_sample"][:], f["samples/token_position"][:]
        token_generated = f["samples/token_generated"][:] if "token_generated" in f["samples"] else None  # mode=generate
        token_step = np.array([step_of.get(int(i), -1) for i in token_sample], dtype=np.int64)
        tokens = np.searchsorted(token_step, steps)
    columns = [_read(f"the capture {c.path}", lambda c=c: _Column(f[c.path], index, step_of_row, state.first_step, token_step))
               for c in _captures(state.path, f)]
    bounds = np.searchsorted(step_of_row, steps)
    tables = {t.name: t.read(f, rows=state.steps) for t in tables_in(f)}  # a kind's rows of the kept batches
    for i, step in enumerate(steps[:-1].tolist()):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        captures = [c for col in columns if (c := col.capture(step, lo, hi)) is not None]
        token_rows = None
        if tokens is not None:
            tlo, thi = int(tokens[i]), int(tokens[i + 1])
            token_rows = (token_sample[tlo:thi], token_position[tlo:thi])
            if token_generated is not None:
                token_rows += (token_generated[tlo:thi],)
        store.write(StepRecord(
            step=step,
            sample_index=index[lo:hi],
            target=target[lo:hi] if target is not None else None,
            path=[p.decode() if isinstance(p, bytes) else p for p in paths[lo:hi]] if paths is not None else None,
            captures=captures,
            samples={k: ds[lo:hi] for k, ds in extra.items()} or None,
            tokens=token_rows,
            tables={name: rows[step] for name, rows in tables.items() if step in rows},
        ))
    return state.steps


class _Column:
    """One old capture dataset, and which of its rows belong to which batch."""

    def __init__(self, ds: h5py.Dataset, index: np.ndarray, step_of_row: np.ndarray, first_step: int = 0,
                 token_step: np.ndarray | None = None) -> None:
        m = CaptureMeta.from_attrs(ds.attrs)
        self.ds = ds
        self.tokens = m.rows is RowKind.TOKENS
        self.ragged = m.ragged
        self.row_shape = m.row_shape
        self.key = CaptureKey(m.hook, m.module, m.type, m.role, m.call)
        self.per_step = m.rows is RowKind.STEPS
        self.torch_dtype = m.torch_dtype
        self.dims = m.dims  # the replayed rows keep the names the old file gave them
        self.attrs = {k: v for k, v in m.extra.items() if k not in ("overflow_values", "underflow_values")}
        self.counts = {"overflow": int(m.extra.get("overflow_values", 0)), "underflow": int(m.extra.get("underflow_values", 0))}  # carried over with the first replayed batch
        self.own_index = ds.parent[m.index][:] if m.index else None
        self.digests = table_of(ds, m.digest) if m.digest and not m.ragged else None  # (batches, 2): end row, xxh3
        if self.own_index is not None:
            if self.per_step:
                self.row_step = self.own_index
            else:
                step_of = dict(zip(index.tolist(), step_of_row.tolist(), strict=True))
                self.row_step = np.array([step_of.get(int(i), -1) for i in self.own_index])
        elif self.tokens:
            self.row_step = token_step[: ds.shape[0]]
        else:
            self.row_step = first_step + np.arange(ds.shape[0]) if self.per_step else step_of_row[: ds.shape[0]]

    def capture(self, step: int, lo: int, hi: int) -> Capture | None:
        first, last = np.searchsorted(self.row_step, [step, step + 1])  # rows are in batch order
        rows = np.arange(first, last)
        if not len(rows):
            return None
        lo_row, hi_row = int(rows[0]), int(rows[-1]) + 1
        data = _read(f"the capture {self.ds.name} rows {lo_row}..{hi_row - 1} (batch {step})", lambda: self.ds[lo_row:hi_row])
        if self.digests is not None and check_block(self.digests, lo_row, hi_row, data) is False:
            raise ConfigError(f"resume: {self.ds.file.filename}: the capture {self.ds.name} rows {lo_row}..{hi_row - 1} "
                              f"(batch {step}) do not match their checksum: the file was damaged on disk; move it away "
                              f"and run again (python -m hookrun.inspect --verify FILE lists every damaged block)")
        counts, self.counts = self.counts, {}
        if self.ragged:
            value = [torch.from_numpy(np.asarray(r).reshape(-1, *self.row_shape)) for r in data]
            return Capture(self.key, value, self.per_step, self.torch_dtype, self.attrs, **counts, ragged=True,
                           dims=self.dims)
        if self.per_step:
            value = torch.from_numpy(data[0])
            return Capture(self.key, value, True, self.torch_dtype, self.attrs, **counts, dims=self.dims)
        if self.tokens:
            return Capture(self.key, torch.from_numpy(data), False, self.torch_dtype, self.attrs, **counts, tokens=True,
                           dims=self.dims)
        explicit = None
        if len(rows) != hi - lo:  # a partial batch (limit): its rows carry their own index
            explicit = self.own_index[rows] if self.own_index is not None else None
        return Capture(self.key, torch.from_numpy(data), False, self.torch_dtype, self.attrs, explicit, **counts, dims=self.dims)
