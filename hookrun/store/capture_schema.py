"""The capture datasets' schema: their attributes, their row kinds, and how a capture is named.

    meta = CaptureMeta("fmap", "layer1.0", "forward", "output", 0, RowKind.SAMPLES, "float32", (64, 8, 8))
    ds.attrs.update(meta.to_attrs())             # the writer (h5store, ragged)
    CaptureMeta.from_attrs(ds.attrs).rows        # RowKind.SAMPLES: merge, resume, patch, readers
    CaptureMeta.from_attrs(ds.attrs).dims        # ('sample', 'channel', 'height', 'width'): one name per axis
    list_captures(file)                          # every capture dataset of an open file, as CaptureInfo
    resolve(captures, ("layer1.0", "output"))    # the one capture a (module, role) key names

This module owns the format of one capture (docs/format.md is its prose): whoever writes or reads
a capture's attributes goes through CaptureMeta, and whoever turns a user's key into a capture
goes through resolve(), so the file run, the merged view, resume, patch, `Run.find` and
`Captured.find` agree on every name and every error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, TypeVar

import h5py
import numpy as np

from hookrun.errors import HookrunError, NotFoundError, close_matches
from hookrun.labels import MODEL_LABEL, capture_label
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
    digest: str = ""  # the sibling dataset with each batch's checksum (store/digest.py); '' where there is none
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


def is_capture(obj: Any) -> bool:
    """Whether an HDF5 object is a capture dataset (a dataset with a `role` attribute)."""
    return isinstance(obj, h5py.Dataset) and "role" in obj.attrs


def label(hook: str, module: str, role: str, call: int = 0) -> str:
    """'hook/module/role' ('@call' after a later call's role; MODEL_LABEL for the whole model)."""
    return capture_label(module, role, call, hook=hook, sep="/")


@dataclass(frozen=True)
class CaptureInfo:
    """One capture dataset of an open file, as the readers list it."""

    hook: str
    module: str
    role: str
    call: int
    type: str
    shape: tuple[int, ...]
    dtype: str
    rows: str  # a RowKind value: samples | steps | tokens
    path: str  # the dataset's path in the file
    nbytes: int  # on disk
    dims: tuple[str, ...] = ()  # one name per axis (the `dims` attribute, or derived for an older file)

    @property
    def label(self) -> str:
        return label(self.hook, self.module, self.role, self.call)


def list_captures(f: h5py.File) -> list[CaptureInfo]:
    """Every capture dataset of an open file (those under /captures with a `role` attribute), depth
    first in name order. An object that HDF5 cannot open (a damaged header) is a HookrunError
    naming it, never a traceback or a silently shorter list."""
    found: list[CaptureInfo] = []
    if "captures" not in f:
        return found

    def walk(group: h5py.Group) -> None:
        try:  # the names come from the group's link table, even for a damaged object; a damaged table
            names = list(group)  # (its local heap) fails here, before any of them
        except (KeyError, OSError, RuntimeError, ValueError) as exc:
            raise unreadable(f, exc, f"the group {group.name}") from None
        for name in names:
            try:
                obj = group[name]
                if isinstance(obj, h5py.Group):
                    walk(obj)
                    continue
                if not is_capture(obj):
                    continue
                m = CaptureMeta.from_attrs(obj.attrs)
                nbytes = obj.size * obj.dtype.itemsize if obj.is_virtual else obj.id.get_storage_size()  # a view: its rows' bytes
                found.append(CaptureInfo(m.hook, m.module, m.role, m.call, m.type, tuple(obj.shape), str(obj.dtype),
                                         m.rows.value, obj.name, nbytes, m.dims))
            except (KeyError, OSError, RuntimeError, ValueError) as exc:
                raise unreadable(f, exc, f"the capture {group.name}/{name}") from None

    try:
        top = f["captures"]
    except (KeyError, OSError, RuntimeError, ValueError) as exc:  # the group's own header
        raise unreadable(f, exc, "the group /captures") from None
    walk(top)
    return found


def unreadable(f: h5py.File, exc: BaseException, what: str) -> HookrunError:
    """`what` of file `f` that HDF5 cannot open: damaged on disk, or changed under a live run's reader."""
    from hookrun.store.lock import changed_while_read  # (only where a read failed)

    return (changed_while_read(f.filename, f"{what}: {damage(exc)}")
            or HookrunError(f"{what} cannot be read: the file is damaged ({damage(exc)})"))


def damage(exc: BaseException) -> str:
    """HDF5's own reason, without h5py's prefix ('Unable to synchronously open object (...)')."""
    text = str(exc).strip().strip("'\"")
    if "(" in text and text.endswith(")"):
        text = text[text.index("(") + 1 : -1]
    return text or type(exc).__name__


def row_index(f: h5py.File, ds: h5py.Dataset) -> np.ndarray:
    """The sample index (or step number) of each row of a capture dataset: its own `<role>.index`
    where it skipped batches, else the first rows of /samples/index (/samples/token_sample for
    token rows, 0, 1, ... for per-step rows)."""
    meta = CaptureMeta.from_attrs(ds.attrs)
    if meta.index:
        return ds.parent[meta.index][:]
    if meta.rows is RowKind.TOKENS:
        return f["samples/token_sample"][: ds.shape[0]]
    if meta.rows in (RowKind.STEPS, RowKind.FEATURES):
        return np.arange(ds.shape[0])
    return f["samples/index"][: ds.shape[0]]


# -- naming a capture ------------------------------------------------------------------------------
class Named(Protocol):
    hook: str
    module: str
    role: str
    call: int

    @property
    def label(self) -> str: ...


T = TypeVar("T", bound=Named)


def parse_key(key: tuple) -> tuple[str | None, str, str]:
    """(hook or None, module, role) of a key given as (module, role), (hook, module, role) or a
    'hook/module/role' string; '(model)' and '__model__' name the whole model."""
    if len(key) == 1 and isinstance(key[0], str) and "/" in key[0]:
        key = tuple(key[0].split("/"))
    if len(key) == 2:
        hook, (module, role) = None, key
    elif len(key) == 3:
        hook, module, role = key
    else:
        raise NotFoundError(f"a capture is named by (module, role) or (hook, module, role), got {key!r}")
    return hook, "" if module in (MODEL_LABEL, "__model__") else module, role


def matches(item: Named, hook: str | None, module: str, role: str, family: bool = False) -> bool:
    """Whether `item` is the capture of `module`'s `role` (with `family`: any role of that family,
    `output` matching `output.1` too), by `hook` where one is given."""
    role_ok = item.role == role or (family and item.role.startswith(role + "."))
    return item.module == module and role_ok and (hook is None or item.hook == hook)


def resolve(items: Sequence[T], key: tuple, call: int = 0, source: str = "", empty: str = "none") -> T:
    """The one item a key names (see parse_key), at `call`. NotFoundError where none does (with the
    closest labels) or where several hooks recorded it (naming them). `source` starts the message
    (a file's name), `empty` is what to say when there is nothing at all."""
    if len(key) == 1 and isinstance(key[0], str) and "/" in key[0]:
        labelled = [c for c in items if c.label == key[0] and (c.call == call or not call)]
        if len(labelled) == 1:  # a label, also where the module's name has a '/' in it
            return labelled[0]
    hook, module, role = parse_key(key)
    hits = [c for c in items if matches(c, hook, module, role) and c.call == call]
    head, at, n = role.rpartition("@")
    if not hits and at and head and n.isdigit() and not call:  # (a file label's 'output@1', as listed: call 1)
        hits = [c for c in items if matches(c, hook, module, head) and c.call == int(n)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise NotFoundError(f"several hooks recorded {module!r} {role!r}: give the hook too, one of "
                            f"{', '.join(sorted(c.hook for c in hits))}")
    labels = [c.label for c in items]
    want = "/".join(k for k in (hook, module or MODEL_LABEL, role) if k is not None)
    hint = close_matches(want, labels)
    head = f"{source} has no capture {want!r}" if source else f"no capture {want!r}"
    raise NotFoundError(head + (f" call {call}" if call else "")
                        + f"; {'closest' if hint else 'captures'}: {', '.join(hint or labels[:10]) or empty}")


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value
