"""Forwards besides the loop's one per batch, loaded only where one runs: the dataset's first items as the loop
calls them (first_batch: prepare's site check, early_stop's probe, the dry-run estimate, generate's preflight,
the module lister, a block kind's setup), a batch of its own for a kind's second forward (own_copy), and a
resumed run's kept batches again (replay).

    indices, call = first_batch(loader, spec, size=1)       # the dataset's first item as the loop calls it
    out = plain_forward(model, own_copy(call))               # a forward that may change its inputs in place
    replay(self, self.begin, kept, self.points, lambda indices, call: self.add(model, call, indices))
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from hookrun.hooks import REPLAY
from hookrun.hooks.session import HookSession
from hookrun.runner.calls import first_items

if TYPE_CHECKING:
    from hookrun.runner.calls import CallSpec, ModelCall
    from hookrun.runner.kinds import RunKind


def first_batch(loader: DataLoader, spec: CallSpec, size: int = 1) -> tuple[torch.Tensor, ModelCall]:
    """The dataset's first `size` items (fewer where it has fewer) as one batch, collated by the
    loader's own collate function and split into the forward call as the loop does: what the
    plan's estimate, generate's preflight and the module lister run before the first real batch."""
    indices, batch = loader.collate_fn(first_items(loader.dataset, size))
    return indices, spec.split(batch)


def own_copy(call: ModelCall) -> ModelCall:
    """The call with its own copy of every input tensor (nested ones too; one tensor passed twice stays one):
    a forward may change its inputs in place (x.clamp_(), x += ...), and a kind's next forward of the
    batch (evaluate's, similarity's `with:` model's) must see the batch as it came."""
    memo: dict[int, torch.Tensor] = {}

    def copy(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return memo.setdefault(id(obj), obj.clone())
        if isinstance(obj, Mapping):
            return {k: copy(v) for k, v in obj.items()}
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(copy(v) for v in obj))
        return type(obj)(copy(v) for v in obj) if isinstance(obj, tuple | list) else obj

    return replace(call, args=copy(call.args), kwargs=copy(call.kwargs), attention_mask=copy(call.attention_mask))


def replay(kind: RunKind, begin: int, kept: int, points: list, each: Callable[[Any, ModelCall], None]) -> None:
    """A resumed run's kept batches of `kind` [begin, begin + kept), each handed to `each(indices, call)` inside the
    forward their step had: the user's hooks (`points`) attached, the batch's step and items set, their
    modifying actions run (REPLAY); records and top_examples do not run again (the file keeps theirs)."""
    with HookSession(points, kind.ctx.env) as session:
        for step, (indices, batch) in enumerate(itertools.islice(kind.ctx.loader, begin + kept)):  # (no batch after)
            if step >= begin:
                call = kind.ctx.spec.split(batch).to(kind.ctx.device)
                session.begin_step(step, len(indices), indices, call.attention_mask, call.batch)
                with session.phase(REPLAY):
                    each(indices, call)
