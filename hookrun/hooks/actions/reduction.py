"""What record's select and reduce do to a tensor before its snapshot (hookrun.hooks.actions.rows),
and the dims they name: loaded only where a record asks for a select, a reduce or dims.

    t = select_reduce(t, [(1, [0, 2], "0, 2")], "mean", ["spatial"], ev, "output")  # on its device
    dim_index("channel", 4, ev, "output")           # 1
    parse_select({"dim": "token", "index": "last"}, where)  # ("token", "last", "last")

Selections are (dim, index, label) as parse_select gives them; an
index of "last" takes each sample's last non-padding token and drops the dim. Reductions over the
token dim leave padding out, also after a selection on it (the mask is selected with the tokens).
A float16 or bfloat16 tensor's mean and norm are accumulated in float32 and left so: snapshot rounds
them once, to the storage dtype (the tensor's own under keep: snapshot(t, None, source=float16)).
A dim is a number, 'spatial' or a name (DIM_NAMES; a channels-last map's LAST_NAMES); a name must be
the axis of that name where the tensor's axes are named (hookrun.hooks.actions.rows.meaning), and
select/reduce drop the axes they remove from the stored names (shaped_names()).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from hookrun.errors import ConfigError, RunError, one_of
from hookrun.hooks import Event, StepState

REDUCERS = ("mean", "max", "norm")
DIM_NAMES = {"channel": 1, "height": 2, "width": 3, "token": 1, "feature": -1}
LAST_NAMES = {**DIM_NAMES, "height": 1, "width": 2, "channel": 3}  # a 4-D channels-last map's (batch, H, W, C)


def _names(ndim: int, last: bool) -> dict:
    return LAST_NAMES if last and ndim == 4 else DIM_NAMES


def check_dim(spec: Any, where: str) -> Any:
    """`spec` itself, where it names a dim of a sample (a number, 'spatial', a name); ConfigError otherwise."""
    if isinstance(spec, bool) or not (isinstance(spec, int) or spec == "spatial" or spec in DIM_NAMES):
        raise ConfigError(f"{where}: dim {spec!r}; use a number, 'spatial' or one of: {one_of(DIM_NAMES)}")
    if spec == 0:
        raise ConfigError(f"{where}: dim 0 is the batch; reduce or select over the dims of a sample (1, 2, ...)")
    return spec


def dim_list(spec: Any, ndim: int, ev: Event, role: str, last: bool = False) -> list[int]:
    """The axes `spec` names (`last`: a 4-D tensor of it is channels last, its space at 1, 2)."""
    if spec == "spatial":
        if ndim < 3:
            raise RunError(f"hook {ev.hook!r} at {ev.where}: {role} has {ndim} dims, no spatial dims to reduce")
        return [1, 2] if last and ndim == 4 else list(range(2, ndim))
    return [dim_index(spec, ndim, ev, role, last)]


def dim_index(spec: Any, ndim: int, ev: Event, role: str, last: bool = False) -> int:
    d = _names(ndim, last).get(spec, spec) if isinstance(spec, str) else spec
    d = d + ndim if d < 0 else d
    if not 0 < d < ndim:
        raise RunError(f"hook {ev.hook!r} at {ev.where}: {role} has {ndim} dims, so dim {spec!r} does not exist")
    return d


def check_selections(tensor: Any, selections: list, where: str, module: str, role: str, last: bool = False) -> None:
    """Before any batch: `selections` (parse_select's) walked over the shape of one sample's tensor as
    select_reduce makes them; an index or slice past an axis is the batch's refusal, one ConfigError
    line, now. Only a (1, ...) tensor (one row per sample, not folded: its axes are a batch's)."""
    if not isinstance(tensor, Tensor) or tensor.dim() < 2 or tensor.shape[0] != 1:
        return
    shape = list(tensor.shape)
    for dim, index, label in selections:
        d = _names(len(shape), last).get(dim, dim) if isinstance(dim, str) else dim
        d = d + len(shape) if d < 0 else d
        if not 0 < d < len(shape):
            raise ConfigError(f"{where}: select dim {dim!r} at {module}: {role} has {len(shape)} dims (shape "
                              f"{tuple(shape)} in one sample's forward), so dim {dim!r} does not exist")
        n = shape[d]
        if index == "last":
            shape.pop(d)
        elif isinstance(index, slice):
            if not len(range(*index.indices(n))):
                raise ConfigError(f"{where}: select {dim}={label} at {module} takes nothing of the {n} entries of {role} "
                                  f"(shape {tuple(shape)} in one sample's forward); give a range within 0:{n}")
            shape[d] = len(range(*index.indices(n)))
        else:
            bad = next((i for i in index if not -n <= i < n), None)
            if bad is not None:
                raise ConfigError(f"{where}: select index {bad} of dim {dim} at {module} is past the {n} entries of {role} "
                                  f"(shape {tuple(shape)} in one sample's forward); use 0 to {n - 1} (or -{n} to -1)")
            shape[d] = len(index)


def parse_selects(select: Any, where: str) -> list[tuple[Any, Any, str]]:
    """record's `select`: one spec or a list of them (applied in order), each parse_select's."""
    specs = [] if select is None else list(select) if isinstance(select, list | tuple) else [select]
    return [parse_select(spec, where) for spec in specs]


def parse_select(spec: Any, where: str) -> tuple[Any, Any, str]:
    """{dim: channel, index: [0, 3]} or {dim: 1, index: "0:64:2"} -> (dim, index list or slice, label)."""
    if not isinstance(spec, Mapping) or set(spec) - {"dim", "index"} or "index" not in spec:
        raise ConfigError(f"{where}: select expects {{dim: DIM, index: [i, j, ...] or 'start:stop:step'}}, got {spec!r}")
    dim = spec.get("dim", 1)
    check_dim(dim, where)
    index = spec["index"]
    if index == "last":
        return dim, "last", "last"
    if isinstance(index, str):
        try:
            parts = [int(p) if p.strip() else None for p in index.split(":")]
            if not 2 <= len(parts) <= 3:
                raise ValueError
        except ValueError:
            raise ConfigError(f"{where}: select index {index!r} is not a slice like '0:64' or '0:64:2'") from None
        return dim, slice(*parts), index
    if isinstance(index, int):
        index = [index]
    if not isinstance(index, list | tuple) or not all(isinstance(i, int) for i in index):
        raise ConfigError(f"{where}: select index must be a list of whole numbers or a slice string, got {index!r}")
    return dim, list(index), ",".join(map(str, index))


def shaped_names(names: list[str], selections: list, reduce_dims: list | None, ev: Event, role: str,
                 last: bool = False) -> list[str]:
    """The names left after record's select (`index: last` drops its axis) and reduce (drops the
    reduced axes), resolved as Record.shape resolves them (`last`: a channels-last role)."""
    names = list(names)
    for dim, index, _ in selections:
        _check_named(dim, names, ev, role, last)
        if index == "last":
            del names[dim_index(dim, len(names), ev, role, last)]
    if reduce_dims:
        for spec in reduce_dims:
            _check_named(spec, names, ev, role, last)
        gone = {d for spec in reduce_dims for d in dim_list(spec, len(names), ev, role, last)}
        names = [x for i, x in enumerate(names) if i not in gone]
    return names


def _check_named(spec: Any, names: list[str], ev: Event, role: str, last: bool = False) -> None:
    """A dim given by name (`dims: token`) must be the axis of that name where the tensor's axes are
    named (meaning()): DIM_NAMES places `token` where a conv map has its channels, so on a feature
    map it reduced the channels, silently; an unnamed axis (dim_2) takes any name."""
    if not isinstance(spec, str) or spec not in DIM_NAMES:
        return
    axis = dim_index(spec, len(names), ev, role, last)
    if names[axis] != spec and not names[axis].startswith("dim_"):
        name, rest = names[axis], ", ".join(names[1:])
        raise RunError(f"hook {ev.hook!r} at {ev.where}: dim {spec!r} is axis {axis} of {role}, "
                       f"which is its {name!r} axis here (its axes after the sample: {rest}); name an axis it has, "
                       f"or give the axis by number")


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


