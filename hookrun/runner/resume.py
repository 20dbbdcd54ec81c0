"""Resume: continue an interrupted or killed run from its last complete batch.

    state = open_resume(path, cfg_yaml)      # refuses a config that would change the captures
    steps = replay(state, store)             # the old batches, written again through the store
    # ... the loop then runs from batch `steps` on; the new file replaces the old one at the end

The old file is only read: its complete batches are written again, batch by batch, into a new
file through the same writer code, so the result equals an uninterrupted run's captures bit for
bit. Until the new file is closed, the old one stays where it was: nothing is lost on a second
failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch
import yaml

from hookrun.analysis.run import list_captures
from hookrun.errors import ConfigError
from hookrun.store.h5store import H5Store
from hookrun.store.records import Capture, CaptureKey, StepRecord

# keys that do not change what is captured
IGNORED = {"resume", "dry_run", "progress", "imports", "output.overwrite", "output.max_bytes",
           "output.flush_every", "output.path", "data.num_workers"}
SAMPLE_KEYS = {"index", "step", "target", "path", "token_sample", "token_position"}
STANDARD_ATTRS = {"hook", "module", "type", "role", "call", "rows", "torch_dtype", "row_shape", "index", "ragged"}


@dataclass
class ResumeState:
    path: Path
    file: h5py.File
    steps: int  # complete batches in the old file
    status: str

    def close(self) -> None:
        self.file.close()


def open_resume(path: Path, config_yaml: str) -> ResumeState | None:
    """The old run to continue, None where there is none; ConfigError where it cannot be."""
    if not path.exists():
        return None
    try:
        f = h5py.File(path, "r", locking=False)
    except OSError as exc:
        raise ConfigError(f"resume: {str(path)!r} cannot be opened ({exc}); move it away to start again") from None
    if "format_version" not in f.attrs or "config" not in f.attrs:
        f.close()
        raise ConfigError(f"resume: {str(path)!r} is not a hookrun file")
    differing = config_differences(yaml.safe_load(f.attrs["config"]), yaml.safe_load(config_yaml))
    if differing:
        f.close()
        raise ConfigError(
            f"resume: the config differs from the one {str(path)!r} was written with, in "
            f"{', '.join(differing)}; resume with the same settings (or start a new run)"
        )
    steps = len(np.unique(f["samples/step"][:]))
    return ResumeState(path, f, steps, str(f.attrs["status"]))


def config_differences(old: dict, new: dict) -> list[str]:
    a, b = _flatten(old), _flatten(new)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and not _ignored(k))
    return keys


def _ignored(key: str) -> bool:
    return any(key == i or key.startswith(i + ".") for i in IGNORED)


def _flatten(d: object, prefix: str = "") -> dict[str, object]:
    if isinstance(d, dict):
        out: dict[str, object] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: d}


def replay(state: ResumeState, store: H5Store) -> int:
    """Write the old file's complete batches into `store`, in order; returns how many."""
    f = state.file
    index = f["samples/index"][:]
    step_of_row = f["samples/step"][:]
    target = f["samples/target"] if "target" in f["samples"] else None
    paths = f["samples/path"] if "path" in f["samples"] else None
    extra = {k: f["samples"][k] for k in f["samples"] if k not in SAMPLE_KEYS}  # data.store keys
    tokens = None
    if "token_sample" in f["samples"]:  # rows: token: the step of each token row, via its sample
        step_of = dict(zip(index.tolist(), step_of_row.tolist(), strict=True))
        token_sample, token_position = f["samples/token_sample"][:], f["samples/token_position"][:]
        token_step = np.array([step_of.get(int(i), -1) for i in token_sample], dtype=np.int64)
        tokens = np.searchsorted(token_step, np.arange(state.steps + 1))
    columns = [_Column(f[c.path], index, step_of_row, token_step if tokens is not None else None) for c in list_captures(f)]
    bounds = np.searchsorted(step_of_row, np.arange(state.steps + 1))
    for step in range(state.steps):
        lo, hi = int(bounds[step]), int(bounds[step + 1])
        captures = [c for col in columns if (c := col.capture(step, lo, hi)) is not None]
        token_rows = None
        if tokens is not None:
            tlo, thi = int(tokens[step]), int(tokens[step + 1])
            token_rows = (token_sample[tlo:thi], token_position[tlo:thi])
        store.write(StepRecord(
            step=step,
            sample_index=index[lo:hi],
            target=target[lo:hi] if target is not None else None,
            path=[p.decode() if isinstance(p, bytes) else p for p in paths[lo:hi]] if paths is not None else None,
            captures=captures,
            samples={k: ds[lo:hi] for k, ds in extra.items()} or None,
            tokens=token_rows,
        ))
    return state.steps


class _Column:
    """One old capture dataset, and which of its rows belong to which batch."""

    def __init__(self, ds: h5py.Dataset, index: np.ndarray, step_of_row: np.ndarray,
                 token_step: np.ndarray | None = None) -> None:
        a = ds.attrs
        self.ds = ds
        self.tokens = str(a["rows"]) == "tokens"
        self.ragged = bool(a.get("ragged", False))
        self.row_shape = tuple(int(d) for d in a["row_shape"])
        self.key = CaptureKey(str(a["hook"]), str(a["module"]), str(a["type"]), str(a["role"]), int(a["call"]))
        self.per_step = str(a["rows"]) == "steps"
        self.torch_dtype = str(a["torch_dtype"])
        self.attrs = {k: v for k, v in a.items() if k not in STANDARD_ATTRS}
        self.own_index = ds.parent[a["index"]][:] if a.get("index") else None
        if self.own_index is not None:
            if self.per_step:
                self.row_step = self.own_index
            else:
                step_of = dict(zip(index.tolist(), step_of_row.tolist(), strict=True))
                self.row_step = np.array([step_of.get(int(i), -1) for i in self.own_index])
        elif self.tokens:
            self.row_step = token_step[: ds.shape[0]]
        else:
            self.row_step = np.arange(ds.shape[0]) if self.per_step else step_of_row[: ds.shape[0]]

    def capture(self, step: int, lo: int, hi: int) -> Capture | None:
        first, last = np.searchsorted(self.row_step, [step, step + 1])  # rows are in batch order
        rows = np.arange(first, last)
        if not len(rows):
            return None
        data = self.ds[int(rows[0]) : int(rows[-1]) + 1]
        if self.ragged:
            value = [torch.from_numpy(np.asarray(r).reshape(-1, *self.row_shape)) for r in data]
            return Capture(self.key, value, self.per_step, self.torch_dtype, self.attrs, ragged=True)
        if self.per_step:
            value = torch.from_numpy(data[0])
            return Capture(self.key, value, True, self.torch_dtype, self.attrs)
        if self.tokens:
            return Capture(self.key, torch.from_numpy(data), False, self.torch_dtype, self.attrs, tokens=True)
        explicit = None
        if len(rows) != hi - lo:  # a partial batch (limit): its rows carry their own index
            explicit = self.own_index[rows] if self.own_index is not None else None
        return Capture(self.key, torch.from_numpy(data), False, self.torch_dtype, self.attrs, explicit)
