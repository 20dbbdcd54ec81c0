"""Dims of a recorded tensor by name, and `select` specs: how record finds the dims it works on,
and the names by meaning it gives the stored axes (the capture's `dims` attribute).

    dim_index("channel", 4, ev, "output")           # 1
    parse_select({"dim": "token", "index": "last"}, where)  # ("token", "last", "last")
    meaning(point, "output", (8, 4, 32, 32), state)  # ['sample', 'head', 'query', 'key'] at .../attn/softmax

A tensor's axes are named from where it came from and its rank (meaning()): an attention pattern
or its scores (a softmax op site inside an attention module, an attention module's weights output
such as GPT-2 eager's `output.1`, TransformerLens' `hook_pattern`) is `head, query, key`; a 4-D
map `channel, height, width`, or `height, width, channel` where it is channels last (HookPoint.last,
hooks/hook_types.py: timm's Swin, torchvision's Permute to NHWC), whose names in reduce `dims` and select
find those axes by meaning; a (B, T, ...) tensor over the batch's tokens `token, ...`; 3-D
`token, feature` (`channel, length` out of a 1-d conv, norm or pool); 2-D `feature`; anything
else `dim_1, dim_2, ...`. An op site's names come first from the structure of its module's calls
(hooks/site_axes.py: which tensor the softmax reads and writes, which operands are queries and keys),
found by the site check before the first batch, so a sequence as long as a head is wide is still
`head, query, key`; the size rules name what that structure does not reach. select/reduce then
drop the axes they remove (shaped_names()).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from hookrun.errors import ConfigError, RunError, one_of
from hookrun.hooks import Event, StepState, family
from hookrun.hooks.hook_types import HookPoint
from hookrun.store import BY_RANK, PATTERN, PATTERN_FNS, unnamed

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


# -- names by meaning ------------------------------------------------------------------------------
PATTERN_HOOKS = ("hook_pattern", "hook_attn_scores")  # TransformerLens HookPoints of (B, H, Q, K) tensors


def meaning(point: HookPoint, role: str, shape: tuple[int, ...], state: StepState | None = None, where: str = "") -> list[str]:
    """The names of a (batch, ...) tensor's axes, the batch first as `sample` (module docstring);
    `where`: the firing's module (MODULE/FN.k for an op site, whose call k picks its structural names)."""
    n = len(shape)
    if n == 4 and family(role) in getattr(point, "last", ()):  # channels last (channels_last(): timm's Swin)
        return ["sample", "height", "width", "channel"]
    known = _structural(point, role, where)
    if known is not None and len(known) == n - 1:
        return ["sample", *known]
    module = point.target if isinstance(point.target, nn.Module) else None
    kind = type(module).__name__.lower() if module is not None else ""
    attention = "attention" in kind or "attn" in kind
    site = point.site[0] if point.site else None
    heads, head_dim = _heads(module) if attention else (None, None)
    tokens = _token_axis(shape, state)
    rest: tuple[str, ...] | None = None
    structured = bool(getattr(point, "axes", None))  # the module's softmax was found: its pattern is known
    if n == 4 and _is_pattern(point.module, role, shape, site, attention, heads, head_dim, structured):
        rest = PATTERN
    elif n == 4 and attention:  # per-head queries, keys, values; anything else in there is unnamed
        if heads is not None and shape[1] == heads and shape[3] == head_dim and shape[2] == shape[3]:
            rest = ("head", "dim_2", "dim_3")  # as many tokens as a head has features: a pattern or values?
        elif heads is not None and shape[1] == heads and shape[3] == head_dim and site is not None:
            rest = ("head", "token", "feature")
        elif heads is not None and shape[2] == heads and tokens and shape[3] == head_dim:
            rest = ("token", "head", "feature")
        else:
            rest = unnamed(3)
    elif n == 3 and attention and _is_weights(role, site):  # nn.MultiheadAttention's head-averaged weights
        rest = ("query", "key")
    elif n == 3 and kind.endswith("1d"):
        rest = ("channel", "length")
    elif n == 5 and kind.endswith("3d"):
        rest = ("channel", "depth", "height", "width")
    elif n == 4 and state is not None and state.attention_mask is not None and shape[-1] == state.attention_mask.shape[-1]:
        rest = unnamed(3)  # over a text batch's tokens (a block's 4-D attention mask): not an image
    elif n == 2 and tokens:
        rest = ("token",)  # input_ids, attention_mask
    else:
        rest = BY_RANK.get(n - 1) if n >= 1 else ()
    return ["sample", *(rest if rest is not None else unnamed(n - 1))]


def _structural(point: HookPoint, role: str, where: str) -> tuple[str, ...] | None:
    """The names the structure of an op site's calls gives (HookPoint.axes, hooks/site_axes.py)."""
    axes = getattr(point, "axes", None)
    if not axes or point.site is None:
        return None
    _, _, k = where.rpartition(".")
    if not k.isdigit():
        return None
    as_output = "output" + role[len("grad"):] if family(role) == "grad" else role  # a gradient has its result's axes
    return axes.get((point.site[0], int(k), as_output))


def _is_pattern(name: str, role: str, shape: tuple[int, ...], site: str | None, attention: bool,
                heads: int | None, head_dim: int | None, structured: bool = False) -> bool:
    if name.rsplit(".", 1)[-1] in PATTERN_HOOKS:
        return True
    if not attention:
        return False
    if site is None:
        return _is_weights(role, None)
    if site in PATTERN_FNS:
        return True  # the probabilities, their input (the scores) and their gradient
    # another op of the attention's code: (B, H, Q, K) scores, masked or scaled, or the dropped-out pattern; by
    # size only where the structure is unknown (a (B, H, T, head_dim / 2) half of a rotary query is no pattern)
    return not structured and family(role) in ("output", "grad") and heads is not None and head_dim is not None and \
        shape[1] == heads and shape[3] != head_dim


def _is_weights(role: str, site: str | None) -> bool:
    """An attention module's weights output: output.1 (GPT-2, LLaMA, BERT eager), output.attentions..."""
    return site is None and family(role) == "output" and role not in ("output", "output.0")


def _heads(module: nn.Module | None) -> tuple[int | None, int | None]:
    """(heads, head dim) of an attention module, where its attributes or config say."""
    cfg = getattr(module, "config", None)
    heads = next((v for v in (getattr(module, "num_heads", None), getattr(module, "num_attention_heads", None),
                              getattr(module, "n_head", None), getattr(cfg, "num_attention_heads", None),
                              getattr(cfg, "n_head", None)) if isinstance(v, int)), None)
    head_dim = next((v for v in (getattr(module, "head_dim", None), getattr(module, "attention_head_size", None))
                     if isinstance(v, int)), None)
    return heads, head_dim


def _token_axis(shape: tuple[int, ...], state: StepState | None) -> bool:
    """Whether axis 1 is the batch's tokens (the attention mask's (B, T) leads the shape)."""
    mask = state.attention_mask if state is not None else None
    return mask is not None and len(shape) >= 2 and tuple(shape[:2]) == tuple(mask.shape)


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


def check_names(names: Any, where: str) -> tuple[str, ...] | None:
    """record `dim_names: [head, query, key]`: one name per axis of a row, unique, plain words."""
    if names is None:
        return None
    if isinstance(names, str) or not isinstance(names, list | tuple) or not all(isinstance(x, str) and x for x in names):
        raise ConfigError(f"{where}: record dim_names={names!r}; expected a list of names, one per axis of a "
                          f"row (after the sample), e.g. [head, query, key]")
    bad = [x for x in names if "/" in x or ":" in x]
    if bad or len(set(names)) != len(names):
        why = f"{bad[0]!r} holds a '/' or ':'" if bad else "a name is repeated"
        raise ConfigError(f"{where}: record dim_names={list(names)}: {why}; give each axis a name of its own")
    return tuple(names)


def stored_names(first: str, row: tuple[int, ...], names: Any = None) -> tuple[str, ...]:
    """(first, *names) where they fit the row (one unique name per axis); dim_1, dim_2, ... otherwise."""
    names = tuple(names) if names is not None else ()
    if len(names) != len(row) or len(set((first, *names))) != len(names) + 1:
        names = unnamed(len(row))
    return (first, *names)


def axis_names(rec: Any, ev: Event, role: str, raw: tuple[int, ...], per_step: bool, folded: bool, shaped: Any) -> tuple[str, ...]:
    """The names of a record action's stored axes for one (role, call), at its first batch: the
    rows' axis, then a row's axes by meaning (a per-step or folded tensor's: dim_1, dim_2, ...), or
    the action's dim_names (their count checked against the row's rank: one RunError line).
    `raw`: the tensor's shape as the hook saw it; `shaped`: after select/reduce (and token rows)."""
    row = tuple(shaped.shape) if per_step else tuple(shaped.shape[1:])
    first = "step" if per_step else "token" if rec.token_rows else "sample"
    if rec.dim_names is not None and len(rec.dim_names) != len(row):
        raise RunError(f"{rec.where}: record dim_names has {len(rec.dim_names)} name(s), but {role} of {ev.where} is "
                       f"stored as one row of shape {row} per {first}: give {len(row)} name(s), one per axis of a row")
    if rec.dim_names is not None or per_step or folded:
        return stored_names(first, row, rec.dim_names)
    full = shaped_names(meaning(rec.point, role, raw, ev.state, ev.module), rec.selections, rec.dims if rec.reduce else None,
                        ev, role, family(role) in rec.point.last)
    return stored_names(first, row, full[2:] if rec.token_rows else full[1:])
