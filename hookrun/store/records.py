"""What one step recorded: capture keys and the tensors handed to the writer.

    key = CaptureKey(hook="fmap", module="layer1.0", type="forward", role="output", call=0)
    key.path  # 'captures/fmap/layer1.0/output'

What the data loop writes to (RunStore): the one interface of a run's store, whatever holds it.

    def end_attrs(store: RunStore, attrs: dict) -> None: store.set_attrs(attrs)

Two classes satisfy it: H5Store (one HDF5 file, store/h5store.py) and PartedStore (HDF5 parts
uploaded to an object store, output/objects/parts.py). The writer thread (store/writer.py), resume's replay,
the end-of-run report and `record limit=N`'s restore take a RunStore and never ask which it is.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from hookrun.errors import RunError, call_role
from hookrun.store import MODEL_NODE


@dataclass(frozen=True)
class CaptureKey:
    hook: str
    module: str
    type: str
    role: str
    call: int = 0

    @property
    def path(self) -> str:
        node = escape(self.module) or MODEL_NODE
        return f"captures/{self.hook}/{node}/{call_role(self.role, self.call)}"


def escape(name: str) -> str:
    """A module name as one HDF5 path component: '/' (a ModuleDict key may hold one) is written
    %2F and '%' is written %25; names without them stay as they are."""
    return name.replace("%", "%25").replace("/", "%2F")


@dataclass
class Capture:
    key: CaptureKey
    value: torch.Tensor  # a snapshot: (batch, ...) or one step's tensor; on the host once transferred
    per_step: bool  # True: one row per step; False: one row per sample
    torch_dtype: str = ""
    attrs: dict = field(default_factory=dict)  # what was done to it (set by record)
    index: np.ndarray | None = None  # sample indices of the rows, where not the whole batch
    overflow: Any = None  # values the cast to the storage dtype turned from finite to inf (a 0-d tensor, or int)
    tokens: bool = False  # one row per non-padding token, aligned with /samples/token_sample
    decoder: bool = False  # token rows of an encoder-decoder's decoder: its tokens' map (hooks/tokens.py)
    ragged: bool = False  # value is a list: one tensor of varying first dim per sample (variable-length rows)
    dims: tuple[str, ...] | None = None  # one name per axis of the dataset as stored (None: derived from rows and rank)
    features: bool = False  # written once at the end of the run, one row per feature (top_examples)
    underflow: Any = None  # nonzero values the cast turned into 0 (below float16's smallest subnormal), as overflow

    def __post_init__(self) -> None:
        if not self.torch_dtype and isinstance(self.value, torch.Tensor):  # a kind's own capture: the tensor's dtype
            self.torch_dtype = str(self.value.dtype).replace("torch.", "")


@dataclass
class StepRecord:
    """Everything the writer needs for one batch."""

    step: int
    sample_index: np.ndarray
    target: np.ndarray | None
    path: list[str] | None
    captures: list[Capture]
    ticket: Any = None  # hookrun.store.writer.Ticket: wait() before reading captures, release() after
    samples: dict[str, np.ndarray] | None = None  # more per-sample arrays for /samples/<name> (data.store)
    tokens: tuple[np.ndarray, ...] | None = None  # (sample index, position[, generated]) of each token row
    token_width: int | None = None  # token rows a sample can get at most (the padded width); None: as this batch
    tables: dict[str, Any] = field(default_factory=dict)  # a kind's rows by table name ({NAME: row}: store/kind_tables.py)
    state: dict[str, dict[str, Any]] | None = None  # stateful actions' state after this batch, by key (saved at flush)


class StepCaptures:
    """The captures of the step in flight, filled by record actions, emptied by the loop."""

    def __init__(self) -> None:
        self._items: dict[CaptureKey, Capture] = {}
        self._parts: dict[CaptureKey, list[torch.Tensor]] = {}  # token rows, one part per model call
        self._repeats: set[CaptureKey] = set()  # the numbers a second record of one call took

    def add(self, capture: Capture) -> None:
        key = capture.key
        if capture.tokens and key in self._items:  # token rows of the next model call (generate)
            first = self._items[key].value
            if tuple(first.shape[1:]) != tuple(capture.value.shape[1:]):
                raise RunError(f"hooks.{key.hook}: {key.module or '(model)'}'s {key.role} has rows of shape "
                               f"{tuple(capture.value.shape[1:])} at a new token's model call, {tuple(first.shape[1:])} "
                               f"before: its token rows cannot join; record a tensor whose shape per token stays "
                               f"the same (name it with what:)")
            self._parts.setdefault(key, [self._items[key].value]).append(capture.value)
            return
        if key in self._repeats:  # a later call's record meets the number a repeat took: the file would mislabel both
            raise RunError(f"hooks.{key.hook}: {key.module or '(model)'} runs more than once in a forward, and the hook "
                           f"records its {key.role} twice in one call (before and after an edit): call {key.call} and "
                           f"the repeat of an earlier call would both be {key.role}@{key.call}; record the edited value "
                           f"in a hook of its own")
        first = key
        while key in self._items:  # the same hook fired twice for one call: keep both
            key = CaptureKey(key.hook, key.module, key.type, key.role, key.call + 1)
        if key != first:
            self._repeats.add(key)
        capture.key = key
        self._items[key] = capture

    def count(self) -> int:
        return len(self._items)

    def copy_shared(self, start: int, storages: set[int]) -> None:
        """The captures added since there were `start` that hold one of `storages` (the hooked tensors'
        memory, a user's action that did not clone): copied, so that what is written is what was seen."""
        for cap in list(self._items.values())[start:]:
            if isinstance(cap.value, torch.Tensor) and cap.value.untyped_storage().data_ptr() in storages:
                cap.value = cap.value.clone()

    def take(self) -> list[Capture]:
        for key, parts in self._parts.items():
            self._items[key].value = torch.cat(parts)
        items = list(self._items.values())
        self._items.clear()
        self._parts.clear()
        self._repeats.clear()
        return items


def check_rows(captures: list[Capture], samples: int, hooks: Collection[str] | None = None, kind: str = "") -> None:
    """What the actions (a user's own too) and the kind handed the store for a batch of `samples`,
    checked before it is copied to the host: a tensor (a ragged capture: a list of them), and where it
    is one row per sample, a first axis of that many rows (or of its `index`'s); the writer would map
    other rows to the batch's samples by position. A bfloat16 tensor is kept as float32 (numpy has
    no bfloat16; the capture's torch_dtype still says bfloat16), as a record action keeps one. A capture
    of no hook in `hooks` (the configured ones) is the kind's own: its message names `kind` (the kind and its class)."""
    for cap in captures:
        owner = f"hooks.{cap.key.hook}" if hooks is None or cap.key.hook in hooks or not kind else kind
        where, value = f"{owner}: the capture {cap.key.path}", cap.value
        if cap.ragged:
            if not isinstance(value, list) or not all(isinstance(v, torch.Tensor) for v in value):
                raise RunError(f"{where} (ragged) is {_what(value)}; give a list of tensors, one per sample")
            cap.value = [v.float() if v.dtype == torch.bfloat16 else v for v in value]
            continue
        if not isinstance(value, torch.Tensor):
            raise RunError(f"{where} is {_what(value)}, not a torch.Tensor; a Capture's value is a tensor of one row "
                           f"per sample (per_step=True: the whole tensor is the batch's one row)")
        if value.dtype == torch.bfloat16:
            cap.value = value.float()
        if cap.per_step or cap.tokens or cap.features:
            continue
        rows = samples if cap.index is None else len(cap.index)
        if value.dim() == 0 or value.shape[0] != rows:
            of = f"the {rows} sample(s) of its index" if cap.index is not None else f"the batch's {rows} sample(s)"
            raise RunError(f"{where} has shape {tuple(value.shape)}: one row per sample needs a first axis of {of}; "
                           f"give per_step=True for one row per batch, or index= for rows of some of the samples")


def _what(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


Key = tuple[str, str, str, int]  # (hook, module, role, call)


@runtime_checkable
class RunStore(Protocol):
    """A run's store: whole batches in (`write`), counts out, closed with the run's status."""

    path: Path | str  # the file, or the object-store URL (messages name it)
    steps: int  # batches written
    samples: int  # samples written

    def write(self, rec: StepRecord) -> None:
        """One batch: every dataset grows by its rows, or (on an error) none does."""

    def flush(self) -> None:
        """Make what was written readable under the run's name."""

    def rows_by_key(self) -> dict[tuple, int]:
        """Rows written so far of each capture, by (hook, module, role, call)."""

    def overflow_by_key(self) -> dict[tuple, int]:
        """Values that became inf when cast to the record dtype, by capture."""

    def underflow_by_key(self) -> dict[tuple, int]:
        """Nonzero values that became 0 when cast to the record dtype, by capture."""

    def set_attrs(self, attrs: dict) -> None:
        """Root attributes of the end of the run."""

    def close(self, status: str) -> None:
        """Flush, mark `status` (complete, interrupted, failed) and close."""
