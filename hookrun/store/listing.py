"""The captures of an open run file, as the readers list them, and the one a user's key names.

    list_captures(file)                          # every capture dataset of an open file, as CaptureInfo
    resolve(captures, ("layer1.0", "output"))    # the one capture a (module, role) key names
    row_index(file, ds)                          # the sample (or step) of each row of a capture

Whoever turns a user's key into a capture goes through resolve(), so the file run, the merged view,
resume, patch, `Run.find` and `Captured.find` agree on every name and every error. A capture's
attributes are store/__init__.py's CaptureMeta.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import h5py
import numpy as np

from hookrun.errors import MODEL_LABEL, HookrunError, NotFoundError, close_matches
from hookrun.store import CaptureMeta, RowKind, label


def is_capture(obj: Any) -> bool:
    """Whether an HDF5 object is a capture dataset (a dataset with a `role` attribute)."""
    return isinstance(obj, h5py.Dataset) and "role" in obj.attrs



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
    from hookrun.store.live import changed_while_read  # (only where a read failed)

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
