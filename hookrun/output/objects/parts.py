"""A run written to an object store: HDF5 parts in a staging folder, uploaded as they finish.

    store = PartedStore(ObjectStoreOutput.of("s3://bucket/cache/captures.h5", staging), attrs, part_bytes=2 << 30)
    store.write(step_record)          # a RunStore (store/records.py), as H5Store (the writer thread calls it)
    store.close("complete")           # last part uploaded, the manifest says 'complete'

Each part is an ordinary hookrun file (docs/format.md) of whole batches, written by H5Store in
`<staging>/<name>.parts/part-NNNNN.h5`; once its rows reach `part_bytes` it is closed (at the next
batch, or at the end: what the run writes after its last batch goes into the last part), and the
upload worker (upload.py) uploads and verifies it while the next part is written, lists it
in the manifest, and removes it locally: the staging folder holds two parts at most. Nothing here
knows S3: the folder is any fsspec URL (object_folder.py). `prepare_resume` finds what a killed or
interrupted run left: parts the manifest lists, finished local parts it does not (uploaded now),
and the part that was being written (the caller replays its whole batches).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from hookrun.errors import ConfigError, StoreError
from hookrun.output.objects.manifest import Manifest, PartEntry
from hookrun.output.objects.object_folder import RemoteFolder
from hookrun.output.objects.upload import LocalPart, ObjectStoreOutput, Uploader, retrying
from hookrun.store import PART_BYTES, CaptureMeta
from hookrun.store.h5store import H5Store
from hookrun.store.listing import list_captures
from hookrun.store.reading import LocalSource
from hookrun.store.records import Capture, StepRecord

log = logging.getLogger("hookrun")
RUN_ATTRS_SKIP = {"status", "steps_complete", "samples_complete", "finished", "part", "parts_of", "first_batch", "last_batch"}


def describe(path: Path, name: str) -> tuple[PartEntry, dict[str, dict], dict]:
    """What the manifest says of a finished part file: its entry, its captures' schema, its root
    attributes (the run's, without the part's counts)."""
    with LocalSource(path, wait=False) as source:
        f = source.file
        steps = f["samples/step"][:]
        tokens = f["samples/token_sample"].shape[0] if "token_sample" in f["samples"] else 0
        rows, schema = {}, {}
        for c in list_captures(f):
            rows[c.path] = int(c.shape[0])
            m = CaptureMeta.from_attrs(f[c.path].attrs)
            schema[c.path] = {"hook": m.hook, "module": m.module, "role": m.role, "call": m.call, "type": m.type,
                              "rows": m.rows.value, "dtype": c.dtype, "shape": list(c.shape[1:]), "dims": list(m.dims)}
            if "limit" in m.extra:  # record limit=N: with many ranks, each rank's first N (readers keep the run's)
                schema[c.path]["limit"] = int(m.extra["limit"])
        attrs = {k: _plain(v) for k, v in f.attrs.items() if k not in RUN_ATTRS_SKIP}
        first, stop = (int(steps[0]), int(steps[-1]) + 1) if len(steps) else (0, 0)
    return PartEntry(name, path.stat().st_size, "", [first, stop], int(len(steps)), int(tokens), rows), schema, attrs


def _plain(v: object) -> object:
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v.decode() if isinstance(v, bytes) else v


def part_status(path: Path) -> str:
    try:
        with h5py.File(path, "r", locking=False) as f:
            return str(f.attrs.get("status", "unreadable"))
    except OSError:
        return "unreadable"


def _index(name: str) -> int:
    return int(name.rsplit("part-", 1)[1].split(".")[0])


@dataclass
class ResumePoint:
    manifest: Manifest  # every verified part, those uploaded now included
    partial: Path | None  # the part being written when the run stopped: its whole batches are replayed
    next_part: int


def prepare_resume(out: ObjectStoreOutput, folder: RemoteFolder) -> ResumePoint | None:
    """What an interrupted or killed run left, made whole: finished local parts the manifest does not
    list are uploaded (and listed) now; None where there is nothing to resume."""
    manifest = out.read_manifest(folder)
    local = sorted(out.parts_dir.glob("part-*.h5"), key=lambda p: _index(p.name)) if out.parts_dir.is_dir() else []
    for old in out.parts_dir.glob(".part-*.creating") if out.parts_dir.is_dir() else []:
        old.unlink(missing_ok=True)  # a part killed before its first flush: nothing in it
    if manifest is not None and manifest.ranks and out.rank is None:
        raise ConfigError(f"resume: {out.url} holds the parts of a {len(manifest.ranks)}-process run; resume it with "
                          f"the same launcher and {len(manifest.ranks)} processes (torchrun --nproc_per_node="
                          f"{len(manifest.ranks)}, or {len(manifest.ranks)} tasks)")
    if manifest is None and not local:
        return None
    if manifest is None:
        manifest = Manifest(out.url)
    listed = {p.name for p in manifest.parts}
    partial = None
    uploader = Uploader(folder, manifest, out.manifest_name)
    for path in local:
        name = out.part(_index(path.name))
        status = part_status(path)
        if name in listed and status == "complete":
            path.unlink()  # killed after the manifest listed it, before it was removed here
        elif status == "complete":
            entry, schema, attrs = describe(path, name)
            if manifest.next_step is not None and entry.steps[0] != manifest.next_step:
                raise ConfigError(f"resume: {path} holds batches {entry.steps[0]}..{entry.steps[1] - 1}, but the parts "
                                  f"before end at batch {manifest.next_step}; move the staging folder away to start again")
            manifest.attrs = manifest.attrs or attrs
            log.info("resume: uploading %s, finished before the run stopped", path.name)
            uploader.upload(LocalPart(path, entry, schema))
        elif partial is None and status in ("running", "interrupted", "failed"):
            partial = path.with_name(path.name + ".resuming")
            os.replace(path, partial)
        else:
            raise ConfigError(f"resume: {path} is a part in state {status!r} that cannot be continued; move it away")
    taken = [_index(p.name) for p in manifest.parts] + [_index(p.name) for p in local]
    return ResumePoint(manifest, partial, max(taken, default=-1) + 1)


class PartedStore:
    """A RunStore (store/records.py) over a sequence of parts (see the module's docstring)."""

    def __init__(self, out: ObjectStoreOutput, attrs: dict, part_bytes: int = PART_BYTES, resume: ResumePoint | None = None,
                 **h5_kwargs) -> None:
        if part_bytes < 1:
            raise ConfigError(f"output.part_bytes must be at least 1, got {part_bytes}")
        self.out, self.attrs, self.part_bytes, self.h5_kwargs = out, dict(attrs), part_bytes, h5_kwargs
        self.path = out.url
        self.folder = out.folder(check=False)
        self.manifest = resume.manifest if resume is not None else Manifest(out.url)
        self.manifest.status, self.manifest.url = "running", out.url
        self.next_part = resume.next_part if resume is not None else 0
        self.uploader = Uploader(self.folder, self.manifest, out.manifest_name)
        out.parts_dir.mkdir(parents=True, exist_ok=True)
        self.current: H5Store | None = None
        self.current_path: Path | None = None
        self.current_bytes = 0
        self.current_features = False
        self.steps = self.manifest.steps
        self.samples = sum(p.samples for p in self.manifest.parts)
        keys = {path: (c["hook"], c["module"], c["role"], c["call"]) for path, c in self.manifest.captures.items()}
        self.done_rows: dict[tuple, int] = {}
        for p in self.manifest.parts:
            for path, n in p.rows.items():
                self.done_rows[keys[path]] = self.done_rows.get(keys[path], 0) + n
        self.done_overflow: dict[tuple, int] = {}
        self.done_underflow: dict[tuple, int] = {}
        self.end_attrs: dict = {}
        if resume is None:  # a new run: whatever an earlier one left under the URL goes (overwrite was checked)
            retrying(f"clearing {out.url}", lambda: self.folder.remove_all(keep=lambda n: not out.owns(n)))
            self._write_manifest()

    # -- writing -------------------------------------------------------------------------------
    def write(self, rec: StepRecord) -> None:
        self.uploader.raise_error()  # the store stayed away: stop now, not at the next part
        if self.current is not None and self.current_bytes >= self.part_bytes:
            self._finish_part()  # (full: closed when the next batch comes, or at close, so that what a run
            # writes after its last batch, write_features, goes into the last batch's part)
        if self.current is None:
            self._open_part()
        before = (self.current.steps, self.current.samples)
        self.current.write(rec)
        self.steps += self.current.steps - before[0]
        self.samples += self.current.samples - before[1]
        self.current_bytes += record_bytes(rec)

    def _open_part(self) -> None:
        k = self.next_part
        self.next_part += 1
        self.current_path = self.out.parts_dir / f"part-{k:05d}.h5"
        self.current = H5Store(self.current_path, {**self.attrs, "part": k, "parts_of": self.out.url}, **self.h5_kwargs)
        self.current_bytes = 0
        self.current_features = False  # end-of-run captures written into it (write_features)

    def _finish_part(self) -> None:
        """Close the part (whole batches, status complete) and hand it to the upload worker."""
        store, path = self.current, self.current_path
        self.current = self.current_path = None
        for key, n in store.rows_by_key().items():
            self.done_rows[key] = self.done_rows.get(key, 0) + n
        for done, counts in ((self.done_overflow, store.overflow_by_key()), (self.done_underflow, store.underflow_by_key())):
            for key, n in counts.items():
                done[key] = done.get(key, 0) + n
        if self.end_attrs:
            store.set_attrs(self.end_attrs)
        steps = store.steps
        store.close("complete")
        if not steps and not self.current_features:  # a part whose only batch failed: nothing to keep
            path.unlink(missing_ok=True)
            return
        entry, schema, attrs = describe(path, self.out.part(int(path.stem.split("-")[1])))
        for k, v in attrs.items():  # the run's attributes (config, model, ...); those set_attrs gave stay
            self.manifest.attrs.setdefault(k, v)
        self.uploader.submit(LocalPart(path, entry, schema))

    def write_features(self, captures: list[Capture]) -> None:
        """End-of-run captures (a similarity run's matrix), written once after the last batch: into the last
        batch's part (still open: a full part closes at the next batch); where this process wrote no batch
        (every batch kept in uploaded parts), into a part of their own, but for those an uploaded part
        holds already (a run killed after its last part was uploaded, before the manifest said complete:
        resumed, it recomputes them from the same batches)."""
        if self.current is None:
            held = {path.lstrip("/") for part in self.manifest.parts for path in part.rows}
            captures = [c for c in captures if c.key.path not in held]
            if not captures:
                return
            self._open_part()
        self.current.write_features(captures)
        self.current_features = True

    def _write_manifest(self) -> None:
        text = self.manifest.to_json()
        retrying(f"writing {self.out.url}/{self.out.manifest_name}",
                 lambda: self.folder.write_text(self.out.manifest_name, text))

    # -- what the runner asks --------------------------------------------------------------------
    def rows_by_key(self) -> dict[tuple, int]:
        rows = dict(self.done_rows)
        for key, n in (self.current.rows_by_key() if self.current is not None else {}).items():
            rows[key] = rows.get(key, 0) + n
        return rows

    def overflow_by_key(self) -> dict[tuple, int]:
        out = dict(self.done_overflow)
        for key, n in (self.current.overflow_by_key() if self.current is not None else {}).items():
            out[key] = out.get(key, 0) + n
        return out

    def underflow_by_key(self) -> dict[tuple, int]:
        out = dict(self.done_underflow)
        for key, n in (self.current.underflow_by_key() if self.current is not None else {}).items():
            out[key] = out.get(key, 0) + n
        return out

    def set_attrs(self, attrs: dict) -> None:
        """Root attributes of the end of the run: on the last part, and in the manifest."""
        self.end_attrs.update(attrs)
        self.manifest.attrs.update({k: _plain(v) for k, v in attrs.items()})

    def flush(self) -> None:
        if self.current is not None:
            self.current.flush()

    def close(self, status: str) -> None:
        """Finish the last part and wait for its upload, then mark the manifest with `status`.
        Raises StoreError where the store stayed away: the parts not uploaded stay in the
        staging folder (named in the message) and `resume=true` uploads them."""
        try:
            if self.current is not None:
                if self.uploader.error is None:
                    self._finish_part()
                else:  # the store is away: keep the part whole, locally, for resume
                    self.current.close("complete")
                    self.uploader.kept.append(self.current_path)
                    self.current = None
        except StoreError:
            pass  # the uploader holds the error, and the part stays in the staging folder
        self.uploader.close()
        if self.uploader.error is None:
            self.manifest.status = status
            self.manifest.attrs["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            try:
                self._write_manifest()
            except StoreError as exc:
                self.uploader.error = exc
        if self.uploader.error is not None:
            raise StoreError(f"{self.uploader.error}; the run is interrupted after {self.steps} batches and the parts not "
                             f"uploaded are kept in {self.out.parts_dir}: run the same command with resume=true "
                             f"to upload them and go on") from None


def record_bytes(rec: StepRecord) -> int:
    """The bytes of one batch's rows (what part_bytes counts)."""
    n = rec.sample_index.nbytes
    for cap in rec.captures:
        values = cap.value if cap.ragged else [cap.value]
        n += sum(v.numel() * v.element_size() for v in values)
    return n
