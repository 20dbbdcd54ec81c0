"""Bytes on disk: the HDF5 store, the writer thread, host transfer, the capture records, the
format constants. It knows nothing of hooks, models or the runner.

The package itself holds the file format (docs/format.md is the full description): its constants (versions, reserved names),
the capture datasets' schema (their attributes, row kinds, axes' names) and their chunks.

    f.attrs["format_version"] == FORMAT_VERSION
    f"captures/{hook}/{module or MODEL_NODE}/{role}"
    storable_text(np.array(["a\x00b"], dtype=object))     # ['a\u2400b']: what a text column holds

A capture's attributes (the writer's, merge's, resume's, patch's and the readers') all go through
CaptureMeta; listing a file's captures and naming one by a user's key (list_captures, resolve) is
store/listing.py, which only the readers load.

    meta = CaptureMeta("fmap", "layer1.0", "forward", "output", 0, RowKind.SAMPLES, "float32", (64, 8, 8))
    ds.attrs.update(meta.to_attrs())             # the writer (h5store, ragged)
    CaptureMeta.from_attrs(ds.attrs).dims        # ('sample', 'channel', 'height', 'width'): one name per axis

Chunks, and what HDF5 allocates for them (whole chunks, the last one too, however few of its rows
are written): the store (store/columns.py, store/writer.py's checksums) chooses its chunks with these,
and the plan's estimate (runner/estimate.py, with store/overhead.py's HDF5 bytes besides) counts with
the same functions and bounds, so that `output.max_bytes` bounds the file an uncompressed run writes;
H5Store's space check counts a batch's whole chunks with them before writing it (batch_bytes).

    bound = capture_bound(cap, samples=64, steps=4, batch=16, token_width=None)   # every: 3 -> 32 rows at most
    rows = chunk_rows(row_bytes=4096, chunk_bytes=1 << 20, max_rows=bound)       # 32: no chunk holds more
    allocated(32, rows) * 4096                                                    # bytes on disk, uncompressed
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from importlib import metadata
from typing import Any

import numpy as np

from hookrun.errors import capture_label

FORMAT_VERSION = "1"  # the layout version written to every file's `format_version` attribute
MODEL_NODE = "__model__"  # the group name for the whole model (module path '')
REFUSED = "refused.txt"  # in a multirun job's folder: the line of its refusal before its file opened (cli/sweep_checks.py)
PART_BYTES = 2 << 30  # an object-store run: bytes of rows per part file (2 GiB), output.part_bytes' default
# what a run's steps and rows are called in its log and in inspect, unless its kind names its own
BATCH_UNITS = ("batches", "samples")


def _package_version() -> str:
    """hookrun's version as installed (pyproject.toml is the one place it is written); a source
    tree that was never installed says so rather than guessing."""
    try:
        return metadata.version("hookrun")
    except metadata.PackageNotFoundError:
        return "0+unknown (not installed)"


HOOKRUN_VERSION = _package_version()  # hookrun.__version__, written to each file's `hookrun_version`


def storable_text(arr: np.ndarray) -> np.ndarray:
    """Texts as HDF5's UTF-8 strings can hold them: a NUL (which ends a C string) becomes U+2400 '\u2400',
    a lone surrogate U+FFFD (a prompt or a sampled token can hold either; the token ids stay exact)."""
    def one(v: object) -> object:
        if not isinstance(v, str):
            return v
        v = v.replace("\x00", "\u2400")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            v = v.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return v
    return np.array([one(v) for v in arr], dtype=object)


# -- a capture dataset's attributes ----------------------------------------------------------------
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
    digest: str = ""  # the sibling dataset with each batch's checksum (store/writer.py); '' where there is none
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
    def of(cls, cap: Any, row_shape: tuple[int, ...]) -> CaptureMeta:
        """The attributes a capture's dataset gets when its first batch is written (`cap`: store/records.py's
        Capture; `cap.dims`: the names record chose; None derives them)."""
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


# -- chunks and their bytes ------------------------------------------------------------------------
INDEX_CHUNK = 8192  # int64 rows (64 KiB) in a chunk of /samples/index, /samples/step and a `<name>.index`
TOKEN_CHUNK = 4096  # int64 rows in a chunk of the token map (/samples/token_sample, token_position, ...)
DIGEST_CHUNK = 1024  # (id, rows, xxh3) rows in a chunk of /checksums
RAGGED_CHUNK = 256  # variable-length rows (16-byte heap references) in a chunk of a ragged capture


def row_bound(per_step: bool, tokens: bool, every: int, limit: int | None, samples: int | None, steps: int | None,
              batch: int | None, token_width: int | None) -> int | None:
    """The most rows a capture can get in a run of `samples` samples in `steps` batches of at most
    `batch` samples (`token_width`: token rows per sample at most); None where that is not known."""
    if tokens:
        n = samples * token_width if samples and token_width else None
    elif per_step:
        n = math.ceil(steps / every) if steps else None  # steps k*every of any `steps` consecutive ones
    elif samples and every > 1 and steps and batch:
        n = min(samples, math.ceil(steps / every) * batch)
    else:
        n = samples or None
    return min(n, limit) if n and limit else limit or n


def capture_bound(cap: Any, samples: int | None, steps: int | None, batch: int | None,
                  token_width: int | None) -> int | None:
    """row_bound of a capture (store/records.py's Capture: format.py imports nothing of the store), by the
    `every` and `limit` that record gave it."""
    limit = cap.attrs.get("limit")
    return row_bound(cap.per_step, cap.tokens, int(cap.attrs.get("every", 1)), int(limit) if limit else None,
                     samples, steps, batch, token_width)


def chunk_rows(row_bytes: int, chunk_bytes: int, max_rows: int | None = None) -> int:
    """Rows of about `chunk_bytes` (at least one); where the dataset gets at most `max_rows`, as few
    chunks as that needs, evenly filled: no chunk holds more rows than the run can write."""
    rows = max(1, chunk_bytes // max(1, row_bytes))
    if max_rows:
        rows = math.ceil(max_rows / math.ceil(max_rows / rows))
    return rows


def capped(chunk: int, bound: int | None) -> int:
    """A fixed chunk length, no longer than the rows the dataset can get (`bound`, where known)."""
    return max(1, min(chunk, bound)) if bound else chunk


def allocated(rows: int, chunk: int) -> int:
    """Rows HDF5 allocates for `rows` written in chunks of `chunk` rows: whole chunks."""
    return math.ceil(rows / chunk) * chunk if rows > 0 else 0


METADATA_BYTES = 64 << 10  # kept free for what a flush and the close write beside the rows (a new file's is ~20 KB)
DATASET_BYTES = 8 << 10  # each new dataset's object header and chunk index (~3 KB measured)


def batch_bytes(store: Any, rec: Any, chunk_bytes: int) -> int:
    """Bytes a batch (a StepRecord `rec`) may add to `store`'s file (an H5Store whose new captures get chunks of
    about `chunk_bytes`), in whole chunks: H5Store refuses a batch the disk cannot hold while there is still room
    to close the file cleanly. A chunked dataset takes whole chunks on disk, so a batch needs the chunks its rows
    open (a capture of a few bytes a row opens a chunk of a few bytes); the sample table's numbers, variable-length
    rows and the metadata a flush writes (object headers, chunk indexes) are counted too."""
    n = len(rec.sample_index)
    new = [cap for cap in rec.captures if cap.key.path not in store._columns]
    need = METADATA_BYTES + DATASET_BYTES * len(new)
    table = store.table
    for ds in (table.index, table.step, *table.optional.values()):  # the sample table's rows
        need += _growth(ds.shape[0], n, ds.chunks[0] if ds.chunks else n, ds.dtype.itemsize)
    if store.samples == 0:
        need += 2 * DATASET_BYTES  # (optional columns: target, tokens, made at the first batch)
    for cap in rec.captures:
        if cap.ragged:
            need += sum(v.numel() * v.element_size() for v in cap.value) + 16 * len(cap.value) + \
                (RAGGED_CHUNK * 16 if cap.key.path not in store._columns else 0)
            continue
        shape = tuple(cap.value.shape)
        rows, row_shape = (1, shape) if cap.per_step else (shape[0], shape[1:])
        row_bytes = max(1, math.prod(row_shape) * cap.value.element_size())
        col = store._columns.get(cap.key.path)
        if col is not None:
            chunk = col.ds.chunks[0] if col.ds.chunks else rows
            need += _growth(col.ds.shape[0], rows, chunk, row_bytes)
            continue
        bound = capture_bound(cap, store.expected[False], store.expected[True], max(1, n),
                                     rec.token_width or math.ceil(max(1, rows) / max(1, n)))
        chunk = chunk_rows(row_bytes, chunk_bytes, bound)  # as columns.new_dataset
        need += _growth(0, rows, chunk, row_bytes)
    return need


def _growth(have: int, rows: int, chunk: int, row_bytes: int) -> int:
    """Bytes of the whole chunks `rows` more rows open in a dataset of `have` rows."""
    return (allocated(have + rows, chunk) - allocated(have, chunk)) * row_bytes
