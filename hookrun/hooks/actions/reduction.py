"""What record does to a tensor before the writer gets it: select, reduce, cast (a snapshot).

    t = select_reduce(t, [(1, [0, 2], "0, 2")], "mean", ["spatial"], ev, "output")  # on its device
    value = snapshot(t, torch.float16)       # a copy in the storage dtype, still on the device
    narrows(t.dtype, value.dtype)            # True: float32 -> float16 can overflow to inf

Selections are (dim, index, label) as hookrun.hooks.actions.dims.parse_select gives them; an
index of "last" takes each sample's last non-padding token and drops the dim. Reductions over the
token dim leave padding out (hookrun.hooks.actions.rows.padding_mask).
"""

from __future__ import annotations

from typing import Any

import torch

from hookrun.errors import RunError
from hookrun.hooks.actions.dims import dim_index, dim_list
from hookrun.hooks.actions.rows import last_positions, padding_mask
from hookrun.hooks.events import Event

REDUCERS = ("mean", "max", "norm")


def select_reduce(t: torch.Tensor, selections: list[tuple], reduce: str | None, dims: list[Any], ev: Event,
                  role: str) -> torch.Tensor:
    """select -> reduce, on the tensor's device (not yet a copy, not yet cast)."""
    t = t.detach()  # select and reduce build no graph
    for dim, index, _ in selections:
        d = dim_index(dim, t.dim(), ev, role)
        if index == "last":  # each sample's last non-padding token; the dim goes
            t = t.movedim(d, 1)[torch.arange(t.shape[0], device=t.device), last_positions(t.movedim(d, 1), 1, ev.state)]
        elif isinstance(index, slice):
            t = t[(slice(None),) * d + (index,)]
        else:
            t = t.index_select(d, torch.as_tensor(index, device=t.device))
    if reduce:
        dims = sorted({d for spec in dims for d in dim_list(spec, t.dim(), ev, role)})
        if not t.is_floating_point():
            t = t.float()
        m = padding_mask(t, dims, ev.state)  # reductions over tokens ignore padding
        if reduce == "mean":
            t = t.mean(dim=dims) if m is None else (t * m).sum(dim=dims) / m.expand_as(t).sum(dim=dims).clamp(min=1)
        elif reduce == "max":
            t = t.amax(dim=dims) if m is None else t.masked_fill(m == 0, float("-inf")).amax(dim=dims)
        else:
            t = torch.linalg.vector_norm(t if m is None else t * m, dim=dims)
    return t


def snapshot(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A detached copy on the tensor's own device, in the storage dtype.

    bfloat16 is rounded to bfloat16 when asked for, then kept as float32 (numpy has no bfloat16).
    The copy to the host happens later, off the hook (hookrun.store.transfer).
    """
    target = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
    if target == torch.bfloat16:
        t = t.to(torch.bfloat16)
        target = torch.float32
    return t.detach().to(dtype=target, copy=True)


def narrows(source: torch.dtype, stored: torch.dtype) -> bool:
    """Whether casting `source` to `stored` can turn a finite value into inf (float32 -> float16)."""
    return source.is_floating_point and stored.is_floating_point and torch.finfo(stored).max < torch.finfo(source).max


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_finite(value: torch.Tensor, ev: Event, role: str, dtype: torch.dtype | None) -> None:
    """The value as it is stored (after select, reduce and the cast) must be finite."""
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        bad = int((~torch.isfinite(value)).sum())
        hint = "; float16 holds values up to 65504: use dtype float32" if value.dtype == torch.float16 else ""
        raise RunError(
            f"hook {ev.hook!r} at {ev.where}: {role} has {bad} non-finite value(s) at step {ev.step} "
            f"as stored, in {dtype_name(value.dtype)} (record check_finite=true){hint}"
        )
