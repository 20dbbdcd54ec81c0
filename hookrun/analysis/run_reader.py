"""Reading one run's file: lazy captures, chunked iteration and statistics, xarray.

    run = open_run("outputs/2026-11-21/10-00-00/captures.h5")
    run["layer1.0", "output"][:8]          # reads 8 rows, nothing else
    run.stats("layer1.0", "output")         # mean, std, min, max, zeros: chunk by chunk

Nothing here needs more memory than one block of rows at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import yaml

from hookrun.analysis import kind_readers as kinds
from hookrun.analysis.batching import BUFFER_BYTES
from hookrun.analysis.labelled import to_dataset
from hookrun.analysis.loader import RowLoader
from hookrun.analysis.reader_names import run_type
from hookrun.analysis.report import build_report
from hookrun.analysis.report.token_text import is_byte_text
from hookrun.analysis.run_notes import run_status
from hookrun.analysis.stats import block_stats, human_bytes, no_values, nonfinite_note
from hookrun.analysis.top import top_example_modules, top_examples
from hookrun.errors import ConfigError, HookrunError, NotFoundError, dataset_label
from hookrun.store.listing import CaptureInfo, list_captures, resolve, row_index
from hookrun.store.reading import LocalSource, RunSource
from hookrun.text_labels import natural_key  # noqa: F401 (natural_key: its name here too)

__all__ = ["CaptureInfo", "Run", "list_captures", "row_index"]

@run_type
class Run:
    """An open capture file. Use as a context manager, or call close()."""

    def __init__(self, source: RunSource | str | Path) -> None:
        self.source = LocalSource(source) if isinstance(source, (str, Path)) else source
        self.path = self.source.path
        self.captures = self.list_captures()

    @property
    def file(self) -> h5py.File:
        """The run's HDF5 content (store/reading.py: the file, or a local view over the parts)."""
        return self.source.file

    def list_captures(self) -> list[CaptureInfo]:
        return list_captures(self.file)

    # -- what the run is -----------------------------------------------------------------------
    @property
    def status(self) -> str:
        return str(self.file.attrs.get("status", "unknown"))

    @property
    def config(self) -> dict:
        """The run's config ({} where the file has no `config` attribute)."""
        text = self.file.attrs.get("config")
        try:
            cfg = yaml.safe_load(text) if text is not None else {}
        except yaml.YAMLError as exc:
            raise HookrunError(f"{str(self.path)!r}: its config attribute is not YAML ({str(exc).splitlines()[0]})") from None
        return cfg if isinstance(cfg, dict) else {}

    @property
    def attrs(self) -> dict:
        return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in self.file.attrs.items() if k != "config"}

    @property
    def samples(self) -> np.ndarray:
        return self.file["samples/index"][:]

    @property
    def targets(self) -> np.ndarray | None:
        return self.file["samples/target"][:] if "target" in self.file["samples"] else None

    def texts(self) -> list[dict[str, Any]]:
        """mode=generate: each sample's prompt and generated text, in the order they ran.

        [{"index": 0, "prompt": "The cat", "text": " sat on ...", "tokens": [...]}, ...]; "prompt" and
        "text" are None where the run knew no tokenizer (the token ids are always there)."""
        samples = self.file["samples"]
        if "generated_ids" not in samples:
            raise NotFoundError(f"{self.path.name} holds no generated text (runs with mode=generate write it)")
        ids, lengths = samples["generated_ids"][:], samples["generated_length"][:]
        prompt = _strings(samples["prompt_text"]) if "prompt_text" in samples else [None] * len(ids)
        text = _strings(samples["generated_text"]) if "generated_text" in samples else [None] * len(ids)
        return [{"index": int(i), "prompt": p, "text": t, "tokens": row[:n].tolist()}
                for i, p, t, row, n in zip(samples["index"][: len(ids)], prompt, text, ids, lengths, strict=True)]

    def __getattr__(self, name: str) -> Any:
        """A kind's reader property or method (analysis/kind_readers.py), asked of the file's kind:
        `run.grids`, `run.grid(name, which)`, `run.edges(top)`, ... (each kind's reader.py);
        on a run of another kind a method says what is missing, and a property is empty."""
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        readers = self.kind_readers()  # (loads the reader of a kind plugin the run names)
        if name in kinds.property_names():
            return kinds.kind_property(readers, self.attrs, name)
        if name not in kinds.method_names(name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}"
                                 + (f" ({note})" if (note := kinds.unread_kind(self.file.attrs)) else ""))
        return kinds.kind_method(self.file, name)

    def kind_readers(self) -> list[kinds.KindReader]:
        """The reader of the run's kind, from its root attributes (analysis/kind_readers.py)."""
        return kinds.readers_by_attrs(self.attrs, lambda: self.file)

    # -- top examples (hooks/actions/top_examples.py) ---------------------------------------------------
    @property
    def top_example_modules(self) -> dict[str, int]:
        """module -> the number of features with top examples (top_examples actions of the run)."""
        return top_example_modules(self.file)

    def top_examples(self, module: str, feature: int) -> list[dict]:
        """The k largest activations of `feature` at `module`, largest first: dicts of value, sample,
        position, context (token texts around it) and at (its index in context); analysis/top.py."""
        return top_examples(self.file, module, feature, is_byte_text(self.config))

    # -- finding a capture ---------------------------------------------------------------------
    def find(self, *key: str, call: int = 0) -> CaptureInfo:
        """By (module, role), (hook, module, role), or a 'hook/module/role' path (store/listing.resolve)."""
        return resolve(self.captures, key, call, source=self.path.name, empty="")

    def __getitem__(self, key: Any) -> h5py.Dataset:
        """The capture's h5py dataset: lazy, slicing reads only the rows asked for."""
        info = self.find(*(key if isinstance(key, tuple) else (key,)))
        return self.file[info.path]

    def index(self, *key: str, call: int = 0) -> np.ndarray:
        """The sample index (or step number) of each row of a capture."""
        return row_index(self.file, self.file[self.find(*key, call=call).path])

    # -- reading in blocks ---------------------------------------------------------------------
    def iter(self, *key: str, batch_size: int = 256, call: int = 0) -> Iterator[np.ndarray]:
        """The capture's rows, `batch_size` at a time."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise ConfigError(f"iter: batch_size must be a whole number of rows, at least 1, got {batch_size!r}")
        ds = self.file[self.find(*key, call=call).path]
        for start in range(0, ds.shape[0], batch_size):
            yield ds[start : start + batch_size]

    def loader(self, capture: str | tuple | list, batch_size: int = 4096, shuffle: bool = True, seed: int = 0,
               drop_last: bool = False, *, concat: bool = True, rank: int = 0, world_size: int = 1,
               buffer_bytes: int = BUFFER_BYTES, block_rows: int | None = None, dtype: Any = None,
               with_rows: bool = False) -> RowLoader:
        """Shuffled batches of a capture's rows as torch tensors, for training (analysis/loader.py).

        `capture` is one name as for find(): ("blocks.3", "output"), ("hook", "blocks.3", "output")
        or "hook/blocks.3/output"; or a list of them, read row-aligned and joined along the feature
        axis (concat=False: a tuple, one tensor per capture). rank/world_size: this process's part;
        buffer_bytes: the shuffle window; block_rows: rows read together (default one chunk);
        dtype: a torch dtype to cast to; with_rows: yield (x, the rows' numbers in the file).

        Args:
            capture: one capture name, or a list of them.
            batch_size, shuffle, seed, drop_last: as torch's DataLoader; the order depends on
                (seed, epoch) only, and every row comes once per epoch.
            concat, rank, world_size, buffer_bytes, block_rows, dtype, with_rows: see above.

        Returns:
            RowLoader: iterable of tensors (batch_size, features); `set_epoch(n)` reshuffles.

        Raises:
            NotFoundError: a capture name that is not in the file (with the closest labels).
        """
        names = capture if isinstance(capture, list) else [capture]
        infos = [self.find(*(c if isinstance(c, tuple) else (c,))) for c in names]
        return RowLoader(self.path, [i.path for i in infos], batch_size=batch_size, shuffle=shuffle, seed=seed,
                         drop_last=drop_last, concat=concat, rank=rank, world_size=world_size,
                         buffer_bytes=buffer_bytes, block_rows=block_rows, dtype=dtype, with_rows=with_rows)

    def stats(self, *key: str, call: int = 0) -> dict[str, float]:
        """mean, std, min, max and the fraction of zeros over the finite values, one block at a time
        (`count` of `values`; `nonfinite` NaN or inf left out)."""
        ds = self.file[self.find(*key, call=call).path]
        return block_stats(ds)

    # -- other views ---------------------------------------------------------------------------
    def to_xarray(self, captures: list | None = None, rows: Any = None) -> Any:
        """An xarray.Dataset of the chosen captures (default: all), loaded into memory.

        Each capture's axes carry the names the file gives them (its `dims` attribute): `sample,
        head, query, key` for an attention pattern, `sample, token, feature` for token-major
        activations, `sample, channel, height, width` for image maps, `token, feature` for token
        rows. `sample` has the dataset indices as its coordinate, `step` the batch numbers, and
        `token` the coordinates `sample` and `position` of each row (`token_sample` and
        `token_position` where the Dataset also has a `sample` axis). An axis name on which the
        chosen captures disagree is qualified per capture: `hook/module/role:channel`
        (hookrun.analysis.labelled). `rows` (a slice, or row numbers) picks every capture's rows.
        """
        try:
            import xarray  # noqa: F401
        except ImportError:
            raise HookrunError("to_xarray needs xarray: pip install 'hookrun[xarray]'") from None
        chosen = self.captures if captures is None else [self.find(*(c if isinstance(c, tuple) else (c,))) for c in captures]
        return to_dataset(self.file, chosen, slice(None) if rows is None else rows, _plain(self.attrs))

    def summary(self, stats: bool = True) -> str:
        """The text `python -m hookrun.inspect` prints for a run: what the file says, and in one
        line what it does not (a file written by another tool, or whose attributes were removed)."""
        a, cfg = self.attrs, self.config
        written = self.written_attrs()
        missing = [k for k in ("config", "model_class", "device", "mode", "steps_complete", "samples_complete",
                               "created", "hookrun_version") if k not in written]
        if "samples_complete" in a and "steps_complete" in a:
            samples, steps = a["samples_complete"], a["steps_complete"]
        else:  # counted where the file does not say
            f = self.file
            samples = a.get("samples_complete", f["samples/index"].shape[0] if "samples/index" in f else 0)
            steps = a.get("steps_complete", len(np.unique(f["samples/step"][:])) if "samples/step" in f else 0)
        readers = self.kind_readers()
        units = kinds.kind_units(readers)  # as the run's kind logged them
        lines = [f"{self.path}", f"  status    {run_status(self)}   ({steps} {units[0]}, {samples} {units[1]})"]  # a killed run: stopped
        if "shards" in a:
            lines.append(f"  shards    {a.get('world_size')} files, view over captures.rank-*.h5"
                         + (f"; not complete: {a['incomplete_shards']}" if a.get("incomplete_shards") else ""))
        where = " ".join(p for p in (a.get("model_class"), a.get("device") and f"on {a['device']}") if p)
        model = ", ".join(p for p in (where, a.get("mode") and f"mode {a['mode']}") if p)
        if model:
            lines.append(f"  model     {model}")
        if cfg:
            lines.append(f"  data      {dataset_label((cfg.get('data') or {}).get('dataset'))}, batch {cfg.get('data', {}).get('batch_size')}")
        written = ", ".join(p for p in (
            a.get("created") and f"{a['created']} .. {a.get('finished', '(not finished)')}",
            a.get("hookrun_version") and f"hookrun {a['hookrun_version']}", a.get("torch_version") and f"torch {a['torch_version']}") if p)
        if written:
            lines.append(f"  written   {written}")
        if cfg:
            lines.append(f"  hooks     {_hooks(cfg)}")
        if missing:
            lines.append(f"  missing   {', '.join(missing)} (not written by hookrun, or removed from the file)")
        lines.append("  captures")
        if not self.captures:
            lines.append("    (none)")
        captures = sorted(self.captures, key=lambda c: natural_key(c.label))
        width = max((len(c.label) for c in captures), default=0) + 2
        shape_width = max((len(str(c.shape)) for c in captures), default=0) + 2
        for c in captures:
            row = f"    {c.label:{width}s}{str(c.shape):{shape_width}s}{c.dtype:9s}{c.rows:8s}{human_bytes(c.nbytes):>10s}"
            if stats:
                s = self.capture_stats(c)
                row += (f"  mean {s['mean']:.4g} std {s['std']:.4g} min {s['min']:.4g} max {s['max']:.4g} zeros {s['zeros']:.1%}"
                        f"{nonfinite_note(s)}" if np.isfinite(s["min"]) else f"  {no_values(c.label, s)}")
            lines.append(row)
        lines.extend(self.kind_lines())
        lines.extend(line for r in readers for line in kinds.asked(r, "attr_lines", a))
        return "\n".join(lines)

    def kind_lines(self) -> list[str]:
        """What the file's kind adds to the summary (a block kind's table; none for a plain record run)."""
        return kinds.kind_lines(self.file)

    def written_attrs(self) -> set[str]:
        """The names of the root attributes the file has (summary names the usual ones missing)."""
        return set(self.file.attrs)

    def capture_stats(self, info: CaptureInfo) -> dict[str, float]:
        """block_stats of a capture (summary's statistics)."""
        return block_stats(self.file[info.path])

    def part_files(self, problems: list[str] | None = None) -> Iterator[h5py.File]:
        """The run's HDF5 files one at a time (one for a local file; every part of an object-store
        cache, fetched and verified): what `inspect --verify` checks."""
        yield from self.source.part_files()

    def report(self) -> Any:
        """This run's HTML report (hookrun.analysis.report): `.save(path)`, shown inline in Jupyter."""
        return build_report(self)

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, status={self.status!r}, captures={len(self.captures)}, samples={self.file['samples/index'].shape[0]})"


def _strings(ds: h5py.Dataset) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in ds[:]]


def _plain(attrs: dict) -> dict:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v.item() if isinstance(v, np.generic) else v) for k, v in attrs.items()}


def _hooks(cfg: dict) -> str:
    hooks = cfg.get("hooks") or {}
    return ", ".join(f"{name} ({spec.get('type')} at {spec.get('at')})" for name, spec in hooks.items()) or "none"
