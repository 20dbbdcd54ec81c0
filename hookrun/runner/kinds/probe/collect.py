"""A batch's probe rows at every hook point: one forward with a forward hook on each module, each
output pooled (pool.py), with each row's target, identity key and dataset item.

    c = Collector(model, ["layer1", "layer2"], block)       # globs resolved, in model order
    rows = c.batch(model, call, indices)                     # {module: (x, y, key, item)}

The target: an item key (a dict item's key; `label` or `target` for a tuple item's target, or a
position), or a function of the batch ({_target_: fn}) giving one target per item (batch,) or per
token (batch, tokens). A row that is a token takes its token's target (or its item's); a row that
is an item takes its item's; a token whose class target is -100 (Hugging Face's ignore_index: a
token-classification data set's sub-word continuations and special tokens) is left out, as padding. Keys: the token id for rows that are one token each (`pool: every`;
`last` with a target per token: a token's identity, where the batch's token ids are known), else the
item index (the control task's identity). The hooks are removed after each forward, also when it fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from hookrun.errors import ConfigError, RunError, close_matches, foreign_code
from hookrun.hooks import REPLAY
from hookrun.hooks.taps import Taps, module_kinds, refuse_non_finite
from hookrun.runner.kinds import plain_forward
from hookrun.runner.kinds.probe.pool import Rows, pool_rows

KINDS = {"f": "float (value) targets", "i": "integer (class) targets"}  # a target array's dtype kind (float64 or int64)

TARGET_NAMES = ("label", "target")
IGNORE = -100  # a token's class target that leaves the token out, as padding: Hugging Face's ignore_index (loss=lm's too)


def token_ids(call: Any) -> torch.Tensor | None:
    """The batch's token ids (batch, tokens): the `input_ids` keyword or item key, else the model's first
    positional input where it is a (batch, tokens) integer tensor (`data.inputs: [tokens]`, a tuple item's
    ids: TransformerLens' `model(tokens)`), as the token hooks read them (hooks/tokens.py); else None. (The
    control task of `pool: every` keyed its rows to their items where the ids were not under `input_ids`.)"""
    ids = call.kwargs.get("input_ids")
    if ids is None and isinstance(call.batch, Mapping):
        ids = call.batch.get("input_ids")
    if ids is None and call.args and isinstance(call.args[0], torch.Tensor) and not call.args[0].is_floating_point() \
            and not call.args[0].is_complex() and call.args[0].dtype is not torch.bool:
        ids = call.args[0]
    return ids if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None


class Collector:
    def __init__(self, model: nn.Module, at: list[str], block: Any) -> None:
        self.taps = Taps(model, at, hook="probe", where="probe.at")
        self.pool, self.block = block.pool, block
        self.by_token: dict[str, bool] = {}  # {hook point: its rows' keys are token ids} (keys)
        self.ordered = False  # taps.names in the order the outputs come (after the first forward)
        target = block.target
        self.where = "probe.target"  # (the last batch's: which key or function gave the targets)
        self.fn = None
        if isinstance(target, Mapping):
            import importlib

            path = str(target["_target_"])
            try:
                module, _, attr = path.rpartition(".")
                self.fn = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError, ValueError) as exc:
                raise ConfigError(f"probe.target._target_={path!r} cannot be imported ({exc}); give a function "
                                  f"package.module.name taking the batch") from None

    def targets(self, call: Any, n: int | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The batch's targets: (batch,) per item or (batch, tokens) per token, checked against the batch's
        `n` items and its (batch, tokens) `mask`."""
        key, batch = self.block.target, call.batch
        if self.fn is not None:
            where = f"probe.target: {self.block.target['_target_']}(batch)"
            with foreign_code(f"{where} raised"):  # (a function for text on another data set, say)
                t = self.fn(batch)
        elif isinstance(batch, Mapping):
            if key not in batch:
                hint = close_matches(str(key), [str(k) for k in batch], n=1)
                raise ConfigError(f"probe.target={key!r}: the items have no key {key!r}"
                                  f"{f'; did you mean {hint[0]}?' if hint else ''} (their keys: "
                                  f"{', '.join(map(str, batch))})")
            t, where = batch[key], f"probe.target={key!r}"
        elif key in TARGET_NAMES and call.target is not None:
            t, where = call.target, f"probe.target={key!r}"
        elif isinstance(key, int) and isinstance(batch, list | tuple) and -len(batch) <= key < len(batch):
            t, where = batch[key], f"probe.target={key}"
        else:
            kind = "tuples or lists" if isinstance(batch, list | tuple) else f"{type(batch).__name__}s"  # (collated: a list)
            if key in TARGET_NAMES:  # (the data's target: none beside the model's input)
                raise ConfigError(f"probe.target={key!r}: the items are {kind} that hold no target beside the model's "
                                  f"input; give each item its target: (x, y) tuples, or dicts with a {key!r} key")
            raise ConfigError(f"probe.target={key!r}: the items are {kind} with no such key; use "
                              f"`label` (the data's target) or a position")
        if isinstance(t, list | tuple) and t and all(isinstance(v, str) for v in t):  # (was 'gives list ()')
            raise ConfigError(f"{where} gives {len(t)} strings ({t[0]!r}, ...): a probe needs integer classes (or float "
                              f"values); map the labels to 0, 1, ... in the data set")
        if not isinstance(t, torch.Tensor) or t.dim() not in (1, 2):
            raise ConfigError(f"{where} gives {type(t).__name__} {tuple(getattr(t, 'shape', ()))}; a probe needs a tensor "
                              f"with one target per item (batch,) or per token (batch, tokens)")
        per_token = t.dim() == 2 and t.shape[1] != 1  # ((batch, 1): a column of one target per item, row_targets)
        if n is not None and t.shape[0] != n or per_token and mask is not None and tuple(t.shape) != tuple(mask.shape):
            want = f"({n},)" + (f" or {tuple(mask.shape)}" if mask is not None else "")
            raise ConfigError(f"{where} gives {tuple(t.shape)} for a batch of {n} items; a probe needs one target per "
                              f"item or per token: {want}")
        self.where = where
        return t.long() if t.dtype == torch.bool else t

    def outputs(self, model: nn.Module, call: Any, mask: torch.Tensor | None,
                items: torch.Tensor | None = None, replay: Any = None) -> dict[str, Rows]:
        """Every hooked module's rows of one forward (early_stop's cut may end it after the last), in the order
        their outputs came (the probes' depth order: named_modules lists a block before the modules inside it), pooled
        in its hook into new memory (hooks/taps.py: the output the hook saw); `items`: the batch's dataset indices;
        `replay`: a HookSession whose REPLAY phase the forward runs in (the user's modifying actions only)."""
        kinds = module_kinds(self.taps)
        def make(name: str, t: torch.Tensor) -> Rows:  # (inside a decoder: its mask and token ids, hooks/sides.py)
            rows = pool_rows(t, self.pool, self.taps.mask(mask), where=name, module=kinds[name], indices=items)
            rows.ids = self.taps.inside[1] if self.taps.inside is not None else None
            return rows

        with self.taps.attached(make), replay.phase(REPLAY) if replay is not None else contextlib.nullcontext():
            plain_forward(model, call)
        if not self.ordered:  # the first forward's order, as similarity's (a block's after the modules in it)
            self.taps.follow_forward()
            self.ordered = True
        return dict(zip(self.taps.names, self.taps.take(), strict=True))

    def batch(self, model: nn.Module, call: Any, indices: torch.Tensor, replay: Any = None) -> dict[str, tuple]:
        """{module: (x float64 (rows, features), y, key, item)} of one batch (host arrays but x); `replay`: outputs'."""
        mask = call.attention_mask
        ids = token_ids(call)
        if mask is None and ids is not None:
            mask = torch.ones_like(ids)
        target = self.targets(call, len(indices), mask)
        out = {}
        for name, rows in self.outputs(model, call, mask, indices, replay).items():
            # (a NaN fit stopped at once and was reported as "not converged", its weights NaN)
            refuse_non_finite(rows.x, indices.cpu()[rows.item.cpu()], f"probe.at: {name}",
                              "a probe needs finite features: probe another module")
            per_token = target.dim() == 2 and target.shape[1] != 1
            x, y = rows.x, self.row_targets(rows, target, name)
            key, item = self.keys(rows, ids, indices, name, per_token), indices.cpu().numpy()[rows.item.cpu().numpy()]
            scored = y != IGNORE if per_token and y.dtype.kind == "i" else None  # (token classes: -100 left out)
            if scored is not None and not scored.all():
                x, y, key, item = x[torch.from_numpy(scored).to(x.device)], y[scored], key[scored], item[scored]
            out[name] = (x, y, key, item)
        return out

    def row_targets(self, rows: Rows, target: torch.Tensor, name: str) -> np.ndarray:
        t = target.detach().cpu()
        if t.dim() == 2 and t.shape[1] == 1:  # (batch, 1): a column of one target per item, also beside token rows
            t = t[:, 0]  # (as sklearn takes y of shape (n, 1); it was refused as per-token, pointing to pool: every)
        if t.dim() == 2:
            if rows.token is None:
                raise ConfigError(f"probe.target gives one target per token {tuple(t.shape)}, but pool={self.pool} makes "
                                  f"one row per item at {name}; use pool: every (or last)")
            if t.shape[1] != rows.length:  # (no mask: the token rows are every token of the output)
                raise ConfigError(f"probe.target gives {t.shape[1]} targets per item (one per token of the batch), but "
                                  f"{name}'s output has {rows.length} token rows (a model that adds tokens, a CLS, or "
                                  f"drops some); probe a module whose tokens are the batch's")
            t = t.reshape(-1)[rows.token.cpu()]
        else:
            t = t[rows.item.cpu()]
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ConfigError(f"{self.where} holds {int((~torch.isfinite(t)).sum())} NaN or infinite target(s) in this batch "
                              f"at {name}; every probe row needs a finite target (leave such items out of the data)")
        return t.numpy().astype(np.float64 if t.is_floating_point() else np.int64)

    def keys(self, rows: Rows, ids: torch.Tensor | None, indices: torch.Tensor, name: str = "",
             per_token: bool = True) -> np.ndarray:
        """Each row's identity for the control task: its token's id where the row is one token (pool every; pool
        last with a target per token, `per_token`: the task is the token's) and the batch's ids are known, else its
        item's index; `by_token[name]` says which."""
        ids = rows.ids if rows.ids is not None else ids
        self.by_token[name] = False
        token_row = rows.token is not None and (self.pool == "every" or per_token)
        if ids is not None and token_row and rows.length != ids.shape[1]:
            # (token rows of another length than the token ids, a mask without padding: rows.token counts the
            # output's slots, not the ids', so they indexed past them or read other items' tokens)
            if self.block.control:
                raise ConfigError(f"probe.control=true with pool: {self.pool} at {name}: its output has {rows.length} token "
                                  f"rows per item and the batch {ids.shape[1]} token ids (a model that adds tokens, a CLS, "
                                  f"or drops some), so which row is which token, the control task's identity, is not "
                                  f"known; probe a module whose tokens are the batch's, or set control: false")
        elif ids is not None and token_row:  # (pool: last keyed its token to the item, so a held-out
            self.by_token[name] = True  # text's control was chance whatever the layer: a selectivity of 0.375 for 0.047)
            return ids.reshape(-1)[rows.token.to(ids.device)].cpu().numpy().astype(np.int64)
        return indices.cpu().numpy()[rows.item.cpu().numpy()].astype(np.int64)


def check_rows(rows: dict[str, tuple], features: dict[str, int], y_kind: str, part: int = 0) -> None:
    """One line where a batch's rows (test_data's: part 1, refused before any batch; a later training batch:
    at that batch) differ from the first batch's in their targets' kind (float test targets beside classes
    made a ridge probe a regression) or in width (`features`: a torch traceback at the fit)."""
    error, these = (ConfigError, "the test items") if part else (RunError, "this batch")
    for name, (x, y, *_) in rows.items():
        if y.dtype.kind != y_kind:
            raise error(f"probe.{'test_data' if part else 'target'}: {these} give{'' if part else 's'} "
                        f"{KINDS[y.dtype.kind]} and the first batch {KINDS[y_kind]}; give integer classes throughout, "
                        "or floats for a regression")
        if x.shape[1] != features[name]:
            give = "test items of the training items' shape" if part else "items of one shape"
            raise error(f"probe.{'test_data' if part else 'at'}: {name} gives rows of {x.shape[1]} features for {these} "
                        f"and {features[name]} for the first batch (its output's width follows the input's shape); "
                        f"give {give}, or probe a module of one width (a feature map, pooled)")
