"""What record does to a tensor's rows and values, and the names of the axes it stores: one row per
sample, step or token, decided once, the copy in the storage dtype (a snapshot) the writer gets, and
the axes' names by meaning (the capture's `dims` attribute).

    rows = RowRule("auto", where="hooks.h.actions.0")
    k = rows.layout(ev, role, tensor)        # 0: one row per step; k >= 1: k rows folded per sample
    value = snapshot(t, torch.float16)       # a copy in the storage dtype, still on the device
    narrows(t.dtype, value.dtype)            # True: float32 -> float16 can overflow to inf
    meaning(point, "output", (8, 4, 32, 32), state)  # ['sample', 'head', 'query', 'key'] at .../attn/softmax

`auto` decides at a capture's first batch: a tensor whose batch is at axis 1 (batch_second: a
sequence-first module's `(T, B, ...)`, hookrun.hooks.actions.batch_axis) is one row per step, with a
warning; a first dim equal to the batch size is one row per sample; a multiple of it (`B*T` flattened
tokens, swin's `B*windows`) is folded to one row of `(k, ...)` per sample; anything else is one row per
step. Later batches keep that decision, so a smaller last batch or a batch of 1 cannot flip it. `sample`
and `step` force the choice; `token` stores one row per non-padding token of `(batch, tokens, ...)`
tensors (the model call's TokenMap, hookrun.hooks.tokens); `ragged` one variable-length row per step,
for a tensor whose first dim changes from batch to batch (detection's box features, `(517, 256, 7, 7)`
then `(520, ...)`). A selection or reduction, made before the snapshot, is
hookrun.hooks.actions.reduction's (loaded only where a record asks for one), as are the dims they name.

A tensor's axes are named from where it came from and its rank (meaning()): an attention pattern
or its scores (a softmax op site inside an attention module, an attention module's weights output
such as GPT-2 eager's `output.1`, TransformerLens' `hook_pattern`) is `head, query, key`; a 4-D
map `channel, height, width`, or `height, width, channel` where it is channels last (HookPoint.last,
hooks/plan.py: timm's Swin, torchvision's Permute to NHWC), whose names in reduce `dims` and select
find those axes by meaning; a (B, T, ...) tensor over the batch's tokens `token, ...`; 3-D
`token, feature` (`channel, length` out of a 1-d conv, norm or pool); 2-D `feature`; anything
else `dim_1, dim_2, ...`. An op site's names come first from the structure of its module's calls
(hooks/site_axes.py: which tensor the softmax reads and writes, which operands are queries and keys),
found by the site check before the first batch, so a sequence as long as a head is wide is still
`head, query, key`; the size rules name what that structure does not reach. select/reduce then
drop the axes they remove (reduction.shaped_names()).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookrun.errors import ConfigError, RunError, one_of
from hookrun.hooks import Event, StepState, family
from hookrun.store import BY_RANK, PATTERN, PATTERN_FNS, unnamed

if TYPE_CHECKING:
    from hookrun.hooks import HookPoint


def snapshot(t: torch.Tensor, dtype: torch.dtype | None, source: torch.dtype | None = None,
             bfloat16: torch.dtype = torch.float32) -> torch.Tensor:
    """A detached copy on the tensor's own device, in the storage dtype: `dtype`, else (keep) the hooked
    tensor's `source` dtype where both are floating (a half tensor's float32 mean or norm is rounded to it
    here, once: a float16 norm past 65504 is inf as any cast's, and the caller counts it), else t's own.

    bfloat16 is rounded to bfloat16 when asked for, then held as `bfloat16` says: float32 for a file
    (numpy has no bfloat16), bfloat16 itself in a capture() block's memory (ActionEnv.bfloat16).
    The copy to the host happens later, off the hook (hookrun.store.writer: HostTransfer).
    """
    if dtype is None and source is not None and source.is_floating_point:
        dtype = source
    target = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
    if target == torch.bfloat16:
        t = t.to(torch.bfloat16)
        target = bfloat16
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


ROWS = ("auto", "sample", "step", "token", "ragged")
STEP = 0


class RowRule:
    def __init__(self, rows: str, where: str, per_step_hook: bool, env: Any = None) -> None:
        rows = {"samples": "sample", "tokens": "token", "steps": "step"}.get(rows, rows)  # (the file's `rows` attribute's words)
        if rows not in ROWS:
            raise ConfigError(f"{where}: record rows={rows!r}; choose from: {one_of(ROWS)}")
        if per_step_hook and rows in ("sample", "token"):
            raise ConfigError(f"{where}: rows={rows} does not fit a param hook, whose gradients have no batch dimension")
        self.rows, self.where, self.per_step_hook, self.env = rows, where, per_step_hook, env
        self.known: dict[tuple[str, int], int] = {}
        self.warned: set[tuple[str, int]] = set()  # (kept over reset: the estimate's batch of one warns for the run)

    def reset(self) -> None:
        self.known.clear()

    def layout(self, ev: Event, role: str, t: torch.Tensor, site: bool = False) -> int:
        """0 for one row per step, k >= 1 for k rows folded into each sample's row (token rows: 1).
        `site`: `ev` is an op site's (its module's batch_first says nothing of the op's tensors)."""
        if self.per_step_hook or self.rows in ("step", "ragged"):
            return STEP
        state, where = ev.state, ev.where
        b, n = state.batch_size, (t.shape[0] if t.dim() else None)
        key = (role, ev.call)
        known = self.known.get(key)
        if known is None:
            second = None
            if t.dim() >= 3 and t.shape[1] == b:  # its batch may be at axis 1 (hookrun.hooks.actions.batch_axis)
                from hookrun.hooks.actions.batch_axis import batch_second, rows_per_step

                second = batch_second(ev, role, t, b, getattr(self.env, "model", None), site)
            shape = f"{role} of {where} has shape {tuple(t.shape)} in a batch of {b}: its batch is at axis 1"
            if second and second[0] and self.rows in ("sample", "token"):
                raise RunError(f"{self.where}: rows={self.rows}, but {shape} ({second[1]}), not first; use rows: step "
                               f"(one row per batch){second[2]}")
            if self.rows == "token":
                known = 1
            elif second and self.rows == "auto":
                known = STEP
                rows_per_step(self, key, shape, second, b, n == b or bool(n and b > 1 and n % b == 0))
            elif n == b:
                known = 1
            elif n and b > 1 and n % b == 0:
                known = n // b
            else:
                known = STEP
            if known == STEP and self.rows == "sample":
                raise RunError(f"{self.where}: rows=sample, but {role} of {where} has shape {tuple(t.shape)} in a batch "
                               f"of {b}: its first dim is not the batch (nor a multiple of it); use rows: step")
            self.known[key] = known
            return known
        if known != STEP and self.rows != "token" and n != known * b:
            raise RunError(
                f"{self.where}: {role} of {where} had {known} row(s) per sample in its first batch, but has shape "
                f"{tuple(t.shape)} in batch {state.step} of {b} samples; record it with rows: step (one row per "
                f"batch), in a record action of its own: {{name: record, what: {role}, rows: step}}"
            )
        return known


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
    full = meaning(rec.point, role, raw, ev.state, ev.module)
    if rec.selections or rec.reduce:  # (hookrun.hooks.actions.reduction: loaded where a record asks for one)
        from hookrun.hooks.actions.reduction import shaped_names

        full = shaped_names(full, rec.selections, rec.dims if rec.reduce else None, ev, role, family(role) in rec.point.last)
    return stored_names(first, row, full[2:] if rec.token_rows else full[1:])
