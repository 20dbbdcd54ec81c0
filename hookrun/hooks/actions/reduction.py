"""What record's select and reduce do to a tensor before its snapshot (hookrun.hooks.actions.rows):
loaded only where a record asks for a select or a reduce.

    t = select_reduce(t, [(1, [0, 2], "0, 2")], "mean", ["spatial"], ev, "output")  # on its device

Selections are (dim, index, label) as hookrun.hooks.actions.dims.parse_select gives them; an
index of "last" takes each sample's last non-padding token and drops the dim. Reductions over the
token dim leave padding out, also after a selection on it (the mask is selected with the tokens).
A float16 or bfloat16 tensor's mean and norm are accumulated in float32 and left so: snapshot rounds
them once, to the storage dtype (the tensor's own under keep: snapshot(t, None, source=float16)).
"""

from __future__ import annotations

from typing import Any

import torch

from hookrun.errors import ConfigError, RunError
from hookrun.hooks import Event, StepState
from hookrun.hooks.actions.dims import dim_index, dim_list

REDUCERS = ("mean", "max", "norm")


def select_reduce(t: torch.Tensor, selections: list[tuple], reduce: str | None, dims: list[Any], ev: Event,
                  role: str, last: bool = False) -> torch.Tensor:
    """select -> reduce, on the tensor's device (not yet a copy, not yet cast). Where axis 1 is the
    batch's tokens (its (batch, tokens) matches the attention mask), each selection on it is made
    on the mask too, so `index: last` and a reduction over it see which of the selected tokens are padding.
    `last`: a 4-D `t` is channels last, (batch, height, width, channel), which the dims' names find."""
    t = t.detach()  # select and reduce build no graph
    mask = token_mask(t, ev.state)  # (batch, tokens) of axis 1, carried through its selections; None: no mask
    picked = []  # the labels of the selections made on the tokens
    for dim, index, label in selections:
        d = dim_index(dim, t.dim(), ev, role, last)
        on_mask = mask is not None and d == 1
        picked += [label] if on_mask else []
        if index == "last":  # each sample's last non-padding token; the dim goes
            pos = last_positions(t.movedim(d, 1), 1, ev.state) if not on_mask else _last(mask, ev, f"select token {label}", "last")
            t = t.movedim(d, 1)[torch.arange(t.shape[0], device=t.device), pos]
            mask = None if on_mask else mask
        elif isinstance(index, slice):
            if not len(range(*index.indices(t.shape[d]))):
                raise ConfigError(f"select {dim}={_slice(index)} at {ev.where} takes nothing of the {t.shape[d]} entries of "
                                  f"{role} (shape {tuple(t.shape)}); give a range within 0:{t.shape[d]}")
            t = t[(slice(None),) * d + (index,)]
            mask = mask[:, index] if on_mask else mask
        else:
            n = t.shape[d]
            bad = next((i for i in index if not -n <= i < n), None)
            if bad is not None:
                raise ConfigError(f"select index {bad} of dim {dim} at {ev.where} is past the {n} entries of {role} "
                                  f"(shape {tuple(t.shape)}); use 0 to {n - 1} (or -{n} to -1)")
            idx = torch.as_tensor([i % n for i in index], dtype=torch.long, device=t.device)
            t = t.index_select(d, idx)
            mask = mask.index_select(1, idx) if on_mask else mask
    if reduce:
        dims = sorted({d for spec in dims for d in dim_list(spec, t.dim(), ev, role, last)})
        if not t.is_floating_point():
            t = t.float()
        m = None if mask is None or 1 not in dims else mask.to(t.dtype).reshape(*mask.shape, *([1] * (t.dim() - 2)))
        if m is not None and picked and reduce != "norm":  # (a token window with no real token of a sample: refused;
            _last(mask, ev, f"select token {' then '.join(picked)}", reduce)  # checked after a selection alone: a device sync)
        # a half tensor's mean and norm are summed in float32 (a float16 sum overflows where the mean fits) and
        acc = torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else None  # left so: snapshot rounds them
        if reduce == "mean":
            t = t.mean(dim=dims, dtype=acc) if m is None else \
                (t * m).sum(dim=dims, dtype=acc) / m.expand_as(t).sum(dim=dims, dtype=acc).clamp(min=1)
        elif reduce == "max":
            t = t.amax(dim=dims) if m is None else t.masked_fill(m == 0, float("-inf")).amax(dim=dims)
        else:
            t = torch.linalg.vector_norm(t if m is None else t * m, dim=dims, dtype=acc)
    return t


def token_mask(t: torch.Tensor, state: StepState) -> torch.Tensor | None:
    """The batch's attention mask as bool on `t`'s device where `t` is (batch, tokens, ...) of it; None otherwise."""
    mask = state.attention_mask
    if mask is None or t.dim() < 2 or tuple(t.shape[:2]) != tuple(mask.shape):
        return None
    return mask.to(t.device).to(torch.bool)


def _last(mask: torch.Tensor, ev: Event, label: str, what: str) -> torch.Tensor:
    """Each sample's last real position in the (batch, selected tokens) `mask`; a sample with none is refused."""
    empty = (~mask.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        ids = ev.state.sample_index
        names = [int(ids[i]) for i in empty] if ids is not None and len(ids) == mask.shape[0] else empty
        raise RunError(f"hook {ev.hook!r} at {ev.where}: {label} holds no real token of sample(s) "
                       f"{names[:8]} (all padding) in batch {ev.step}, so {what} has no value there; select tokens "
                       f"every sample has (with left padding they are at the end), or record without the selection")
    size = mask.shape[1]
    return (size - 1 - mask.flip(1).to(torch.int8).argmax(dim=1)).long()


def _slice(s: slice) -> str:
    """'start:stop:step' as the config wrote it."""
    text = ":".join("" if v is None else str(v) for v in (s.start, s.stop, s.step))
    return text[:-1] if s.step is None else text


def last_positions(t: torch.Tensor, dim: int, state: StepState) -> torch.Tensor:
    """Each sample's last non-padding position along `dim` (the last position without a mask)."""
    mask = state.attention_mask
    size = t.shape[dim]
    if mask is None or tuple(mask.shape) != (t.shape[0], size):
        return torch.full((t.shape[0],), size - 1, dtype=torch.long, device=t.device)
    m = mask.to(t.device).to(torch.bool)
    return (size - 1 - m.flip(1).to(torch.int8).argmax(dim=1)).long()


