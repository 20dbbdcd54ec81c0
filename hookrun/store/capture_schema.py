"""The capture datasets' schema: their attributes, their row kinds, their axes' names, and the
checksums of their rows.

    meta = CaptureMeta("fmap", "layer1.0", "forward", "output", 0, RowKind.SAMPLES, "float32", (64, 8, 8))
    ds.attrs.update(meta.to_attrs())             # the writer (h5store, ragged)
    CaptureMeta.from_attrs(ds.attrs).rows        # RowKind.SAMPLES: merge, resume, patch, readers
    CaptureMeta.from_attrs(ds.attrs).dims        # ('sample', 'channel', 'height', 'width'): one name per axis
    ds.attrs["digest"] == "/checksums:3"         # the run's checksum table, and this capture's number in it
    f["/checksums"][j] == [3, end_row, xxh3]     # rows [previous end, end_row) of one batch of capture 3

This module owns the format of one capture (docs/format.md is its prose): whoever writes or reads
a capture's attributes goes through CaptureMeta. Listing a file's captures and naming one by a
user's key (list_captures, resolve) is store/listing.py, which only the readers load.

Every append of a capture's rows (one batch) adds one row to the run's /checksums table: the
capture's number, its row count after the batch and the xxh3-64 digest of those rows' bytes as
stored. A reader recomputes it from the rows alone, so a damaged block of a file is named, never
read as if it were data (store/verify.py: resume and `python -m hookrun.inspect --verify FILE`).
Written by the store's writer thread at each flush; xxh3 runs at about 15 GB/s (docs/benchmarks.md
has its cost). Each capture's `<role>.index` and every /samples dataset (what maps a row to its
sample) are digested too, from their rows read back as stored (DigestLog.add_rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
import xxhash

from hookrun.labels import capture_label
from hookrun.store.format import DIGEST_CHUNK, capped

if TYPE_CHECKING:
    from hookrun.store.records import Capture


class RowKind(str, Enum):
    """What one row of a capture is (the `rows` attribute; the strings are the file's)."""

    SAMPLES = "samples"  # one row per sample, aligned with /samples/index (or its own `<role>.index`)
    STEPS = "steps"  # one row per batch (parameter gradients, `rows: step`)
    TOKENS = "tokens"  # one row per real token, aligned with /samples/token_sample
    FEATURES = "features"  # one row per feature, written once at the end of the run (top_examples)

    def __str__(self) -> str:
        return self.value


STANDARD = ("hook", "module", "type", "role", "call", "rows", "torch_dtype", "row_shape", "index", "ragged", "digest",
            "dims")
FIRST_DIM = {RowKind.SAMPLES: "sample", RowKind.STEPS: "step", RowKind.TOKENS: "token", RowKind.FEATURES: "feature"}  # the rows' axis
# the axes of a row by its rank, where nothing else is known: (B, D), (B, T, D), (B, C, H, W)
BY_RANK = {0: (), 1: ("feature",), 2: ("token", "feature"), 3: ("channel", "height", "width")}
PATTERN = ("head", "query", "key")  # an attention pattern's (or its scores') axes after the sample
PATTERN_FNS = ("softmax", "_softmax", "log_softmax")  # op sites whose 4-D result in an attention module is one


@dataclass
class CaptureMeta:
    """A capture's attributes: where it was hooked, what a row is, and what record did to it."""

    hook: str
    module: str  # module path ('' is the whole model), parameter name or op site
    type: str  # the hook type (forward, backward, tensor, ...)
    role: str  # input, output, grad_input.0, ...
    call: int
    rows: RowKind
    torch_dtype: str  # the dtype the tensor had before the storage cast
    row_shape: tuple[int, ...]
    index: str = ""  # the sibling dataset with each row's sample (or step) index, where rows skip
    ragged: bool = False  # variable-length rows (one flattened row per sample or step)
    digest: str = ""  # the sibling dataset with each batch's checksum (below); '' where there is none
    dims: tuple[str, ...] = ()  # one name per axis of the dataset as stored; () derives them (derive_dims)
    extra: dict[str, Any] = field(default_factory=dict)  # reduce, select, every, limit, overflow_values, ...

    def __post_init__(self) -> None:
        self.dims = tuple(self.dims) or derive_dims(self.rows, self.row_shape, self.ragged, self.module, self.role)

    def to_attrs(self) -> dict[str, Any]:
        attrs = {"hook": self.hook, "module": self.module, "type": self.type, "role": self.role, "call": self.call,
                 "rows": self.rows.value, "torch_dtype": self.torch_dtype,
                 "row_shape": np.array(self.row_shape, dtype=np.int64), "index": self.index, "dims": list(self.dims)}
        if self.ragged:
            attrs["ragged"] = True
        if self.digest:
            attrs["digest"] = self.digest
        return {**attrs, **self.extra}

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> CaptureMeta:
        a = attrs
        return cls(str(a["hook"]), str(a["module"]), str(a["type"]), str(a["role"]), int(a["call"]), RowKind(str(a["rows"])),
                   str(a.get("torch_dtype", "")), tuple(int(d) for d in a.get("row_shape", ())), str(a.get("index", "") or ""),
                   bool(a.get("ragged", False)), str(a.get("digest", "") or ""),
                   tuple(_text(d) for d in a.get("dims", ())),  # a file written before `dims`: derived
                   {k: _plain(v) for k, v in a.items() if k not in STANDARD})

    @classmethod
    def of(cls, cap: Capture, row_shape: tuple[int, ...]) -> CaptureMeta:
        """The attributes a capture's dataset gets when its first batch is written (`cap.dims`: the
        names record chose; None derives them)."""
        k = cap.key
        rows = (RowKind.FEATURES if cap.features else RowKind.STEPS if cap.per_step else RowKind.TOKENS if cap.tokens
                else RowKind.SAMPLES)
        return cls(k.hook, k.module, k.type, k.role, k.call, rows, cap.torch_dtype, tuple(row_shape),
                   ragged=cap.ragged, dims=tuple(cap.dims or ()), extra=dict(cap.attrs))

    @property
    def key(self) -> tuple[str, str, str, int]:
        return self.hook, self.module, self.role, self.call

    @property
    def label(self) -> str:
        return label(self.hook, self.module, self.role, self.call)


def derive_dims(rows: RowKind, row_shape: tuple[int, ...], ragged: bool = False, module: str = "",
                role: str = "") -> tuple[str, ...]:
    """Axis names from what a capture's attributes say, for files written before the `dims`
    attribute and for writers that name none: the rows' axis (sample, step, token), then a row's
    axes by rank (BY_RANK; a 3-D row of an op site `.../softmax.k` is an attention pattern),
    `dim_1`, `dim_2`, ... where the rank says nothing (and for per-step rows)."""
    first = FIRST_DIM[rows]
    if ragged:  # one flattened row per sample or step
        return (first,)
    n = len(row_shape)
    site_fn = module.rsplit("/", 1)[1].split(".", 1)[0] if "/" in module else ""
    if rows is RowKind.SAMPLES and n == 3 and site_fn in PATTERN_FNS and role.split(".", 1)[0] in ("output", "grad", "input"):
        return (first, *PATTERN)
    known = BY_RANK.get(n) if rows is RowKind.SAMPLES else ("feature",) if rows is RowKind.TOKENS and n == 1 else None
    return (first, *(known if known is not None else unnamed(n)))


def unnamed(n: int, start: int = 1) -> tuple[str, ...]:
    return tuple(f"dim_{i}" for i in range(start, start + n))


def label(hook: str, module: str, role: str, call: int = 0) -> str:
    """'hook/module/role' ('@call' after a later call's role; MODEL_LABEL for the whole model)."""
    return capture_label(module, role, call, hook=hook, sep="/")


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


# -- the checksums of stored rows ------------------------------------------------------------------
TABLE = "/checksums"


class DigestLog:
    """The run's /checksums table as a store writes it: rows kept in memory between flushes, one
    HDF5 append per flush (a table per capture held a chunk cache each: 600 captures grew memory
    past the load test's bound)."""

    def __init__(self, file: h5py.File, steps: int | None = None) -> None:
        self.file, self.steps = file, steps  # steps: the run's batches, where known (no chunk holds more rows)
        self.pending: list[tuple[int, int, int]] = []  # (dataset's number, rows after the batch, xxh3)
        self.table: h5py.Dataset | None = None
        self.ids: dict[str, int] = {}  # datasets numbered by id_of (the sample table's)
        self.next_id = 0

    def new_id(self, ds: h5py.Dataset) -> int:
        """The next number in the table, named in the dataset's `digest` attribute."""
        k, self.next_id = self.next_id, self.next_id + 1
        ds.attrs["digest"] = f"{TABLE}:{k}"
        return k

    def id_of(self, ds: h5py.Dataset) -> int:
        """The dataset's number, given at its first call."""
        if ds.name not in self.ids:
            self.ids[ds.name] = self.new_id(ds)
        return self.ids[ds.name]

    def add(self, k: int, rows_after: int, value: int) -> None:
        self.pending.append((k, rows_after, value))

    def add_rows(self, ds: h5py.Dataset, start: int) -> None:
        """The digest of `ds`'s rows from `start` to its end (what a batch appended; a new dataset's
        backfill too), read back as stored; nothing where no row was appended."""
        if ds.shape[0] > start:
            self.add(self.id_of(ds), ds.shape[0], digest_stored(ds, ds[start:]))

    def mark(self) -> tuple[int, int]:
        return len(self.pending), self.next_id

    def roll_back(self, mark: tuple[int, int]) -> None:
        """Take out a failed batch's digests, and the numbers it gave: its new datasets are deleted, and
        one that stays (the sample table's) loses its `digest` attribute, to get a number again."""
        del self.pending[mark[0]:]
        for name in [name for name, k in self.ids.items() if k >= mark[1]]:
            del self.ids[name]
            if name in self.file and "digest" in self.file[name].attrs:
                del self.file[name].attrs["digest"]
        self.next_id = mark[1]

    def write(self) -> None:
        """The digests of the batches since the last flush, appended to the table."""
        if not self.pending:
            return
        if self.table is None:
            rows = capped(DIGEST_CHUNK, self.steps * len(self.pending) if self.steps else None)  # the first batch's x steps
            self.table = self.file.create_dataset(TABLE, (0, 3), "uint64", maxshape=(None, 3), chunks=(rows, 3),
                                                  rdcc_nbytes=64 << 10, rdcc_w0=1.0)
        rows = np.array(self.pending, dtype=np.uint64)
        n = self.table.shape[0]
        self.table.resize(n + len(rows), axis=0)
        self.table[n:] = rows
        self.pending.clear()


def digest(rows: np.ndarray) -> int:
    """The xxh3-64 digest of rows as they are stored (C order, the dataset's dtype)."""
    flat = np.ascontiguousarray(rows).reshape(-1).view(np.uint8)  # also for a dim of size 0
    return xxhash.xxh3_64_intdigest(flat)


def digest_ragged(rows: list[np.ndarray]) -> int:
    """The xxh3-64 digest of variable-length rows (each flattened, in the dataset's base dtype):
    their lengths (int64), then their values, so rows moved between samples do not match."""
    h = xxhash.xxh3_64(np.array([r.size for r in rows], dtype=np.int64).tobytes())
    for r in rows:
        h.update(np.ascontiguousarray(r).reshape(-1).view(np.uint8))
    return h.intdigest()


def digest_stored(ds: h5py.Dataset, rows: np.ndarray) -> int:
    """The digest of rows read from `ds` (or as they are written to it): fixed-size rows as they are,
    variable-length ones by digest_ragged (texts as their UTF-8 bytes)."""
    base = h5py.check_vlen_dtype(ds.dtype)
    if base is None:
        return digest(rows)
    if base in (str, bytes):
        return digest_ragged([np.frombuffer(v.encode() if isinstance(v, str) else bytes(v), np.uint8)
                              for v in rows.reshape(-1)])
    return digest_ragged(list(rows))
