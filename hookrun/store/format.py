"""The file format's constants: versions and reserved names (docs/format.md is the full description).

    f.attrs["format_version"] == FORMAT_VERSION
    f"captures/{hook}/{module or MODEL_NODE}/{role}"
    storable_text(np.array(["a\x00b"], dtype=object))     # ['a\u2400b']: what a text column holds

Chunks, and what HDF5 allocates for them (whole chunks, the last one too, however few of its rows
are written): the store (store/columns.py, store/capture_schema.py) chooses its chunks with these, and the
plan's estimate (runner/estimate.py) counts with the same functions and bounds, so that
`output.max_bytes` bounds the file an uncompressed run writes; H5Store's space check counts a batch's
whole chunks with them before writing it (batch_bytes).

    bound = capture_bound(cap, samples=64, steps=4, batch=16, token_width=None)   # every: 3 -> 32 rows at most
    rows = chunk_rows(row_bytes=4096, chunk_bytes=1 << 20, max_rows=bound)       # 32: no chunk holds more
    allocated(32, rows) * 4096                                                    # bytes on disk, uncompressed
"""

from __future__ import annotations

import math
from importlib import metadata
from typing import Any

import numpy as np

FORMAT_VERSION = "1"  # the layout version written to every file's `format_version` attribute
MODEL_NODE = "__model__"  # the group name for the whole model (module path '')
REFUSED = "refused.txt"  # in a multirun job's folder: the line of its refusal before its file opened (cli/run_record.py)
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


# -- chunks and their bytes ------------------------------------------------------------------------
INDEX_CHUNK = 8192  # int64 rows (64 KiB) in a chunk of /samples/index, /samples/step and a `<name>.index`
TOKEN_CHUNK = 4096  # int64 rows in a chunk of the token map (/samples/token_sample, token_position, ...)
DIGEST_CHUNK = 1024  # (id, rows, xxh3) rows in a chunk of /checksums
RAGGED_CHUNK = 256  # variable-length rows (16-byte heap references) in a chunk of a ragged capture
# what HDF5 adds besides the chunks (fs_strategy none, the earliest file format; metadata_bytes): the
# superblock and root group, each group's symbol table and name heap, each dataset's object header
# (a capture's with its attributes). Measured on hookrun's files, rounded up.
FILE_BYTES, GROUP_BYTES, CAPTURE_HEADER, DATASET_HEADER = 2 << 10, 2 << 10, 1280, 384
ATTR_BYTES = 96  # an attribute's message in an object header, besides its value: its name, datatype, dataspace


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


def index_bytes(bound: int) -> int:
    """A `<name>.index` (int64) of at most `bound` rows, in its chunks."""
    return allocated(bound, capped(INDEX_CHUNK, bound)) * 8


def metadata_bytes(datasets: list[tuple[int, int, bool]], groups: int, attrs_bytes: int = 0) -> int:
    """HDF5's own bytes in a file of `groups` groups (the root too) and `datasets` given as (rank,
    chunks, a capture's: its attributes): object headers, chunk B-tree nodes (one per 64 chunks,
    half full after a split), symbol tables, the root's attributes (`attrs_bytes` of text)."""
    return FILE_BYTES + attrs_bytes + groups * GROUP_BYTES + dataset_bytes(datasets)


def dataset_bytes(datasets: list[tuple[int, int, bool]]) -> int:
    """The object headers and chunk B-tree nodes of `datasets` (see metadata_bytes)."""
    total = 0
    for rank, chunks, capture in datasets:
        node = 1576 + 520 * rank  # a v1 B-tree node of 64 chunk addresses and 65 keys of rank + 1 offsets
        total += (CAPTURE_HEADER if capture else DATASET_HEADER) + node * (1 if chunks <= 64 else math.ceil(chunks / 32) + 1)
    return total


def table_bytes(groups: int, datasets: int, attrs: int, text: int = 0) -> int:
    """HDF5's own bytes for `groups` groups, `datasets` contiguous datasets (an object header each, no chunk
    index), `attrs` attributes and `text` bytes of their values: what a kind writes whole (a probe's groups,
    evaluate's totals), and the file's root attributes (runner/run.plan_estimate)."""
    return groups * GROUP_BYTES + datasets * DATASET_HEADER + attrs * ATTR_BYTES + text


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
