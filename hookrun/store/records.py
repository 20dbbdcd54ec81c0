"""What one step recorded: capture keys and the tensors handed to the writer.

    key = CaptureKey(hook="fmap", module="layer1.0", type="forward", role="output", call=0)
    key.path  # 'captures/fmap/layer1.0/output'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hookrun.labels import call_role
from hookrun.store.format import MODEL_NODE


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
    ragged: bool = False  # value is a list: one tensor of varying first dim per sample (variable-length rows)
    dims: tuple[str, ...] | None = None  # one name per axis of the dataset as stored (None: derived from rows and rank)
    features: bool = False  # written once at the end of the run, one row per feature (top_examples)


@dataclass
class StepRecord:
    """Everything the writer needs for one batch."""

    step: int
    sample_index: np.ndarray
    target: np.ndarray | None
    path: list[str] | None
    captures: list[Capture]
    ticket: Any = None  # hookrun.store.transfer.Ticket: wait() before reading captures, release() after
    samples: dict[str, np.ndarray] | None = None  # more per-sample arrays for /samples/<name> (data.store)
    tokens: tuple[np.ndarray, ...] | None = None  # (sample index, position[, generated]) of each token row
    tables: dict[str, Any] = field(default_factory=dict)  # a kind's rows by table name ({NAME: row}: store/tables.py)
    state: dict[str, dict[str, Any]] | None = None  # stateful actions' state after this batch, by key (saved at flush)


class StepCaptures:
    """The captures of the step in flight, filled by record actions, emptied by the loop."""

    def __init__(self) -> None:
        self._items: dict[CaptureKey, Capture] = {}
        self._parts: dict[CaptureKey, list[torch.Tensor]] = {}  # token rows, one part per model call

    def add(self, capture: Capture) -> None:
        key = capture.key
        if capture.tokens and key in self._items:  # token rows of the next model call (generate)
            self._parts.setdefault(key, [self._items[key].value]).append(capture.value)
            return
        while key in self._items:  # the same hook fired twice for one call: keep both
            key = CaptureKey(key.hook, key.module, key.type, key.role, key.call + 1)
        capture.key = key
        self._items[key] = capture

    def take(self) -> list[Capture]:
        for key, parts in self._parts.items():
            self._items[key].value = torch.cat(parts)
        items = list(self._items.values())
        self._items.clear()
        self._parts.clear()
        return items
