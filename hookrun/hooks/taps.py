"""Forward hooks at a model's modules for one forward at a time, each output made into a kind's rows
inside its hook (the probe's and the similarity's features).

    taps = Taps(model, ["layer1", "layer*"], hook="similarity", where="similarity.at")
    with taps.attached(lambda name, t: t.reshape(len(t), -1).clone()):
        model(x)
    taps.take()      # [each module's rows], in the modules' order

`make(name, tensor)` runs in the hook: the forward may change a module's output in place once its
hooks have returned (conv -> ReLU(inplace=True)), so whatever the rows keep must be new memory made
there. The tensor is the module's output, a tuple's first tensor, or a ModelOutput's
`last_hidden_state` (else its first tensor); a channels-last 4-D map (channels_last(): timm's Swin) is
handed over as (batch, channels, height, width), and a sequence-first module's (tokens, batch, ...)
(batch_first=False: nn.TransformerEncoderLayer, nn.LSTM, nn.MultiheadAttention) as (batch, tokens, ...). A module that runs twice in one forward (a shared
module), that gives no tensor or that does not run is one line naming it. Every handle is removed
after the forward, also when it fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError, RunError
from hookrun.hooks.actions.batch_axis import declared_batch_first
from hookrun.hooks.plan import channels_last, resolve_targets
from hookrun.hooks.sides import Decoder


def output_tensor(out: Any) -> torch.Tensor | None:
    """A module's output tensor: itself, a tuple's first, a ModelOutput's last_hidden_state or first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, tuple | list):
        return next((t for t in (output_tensor(o) for o in out) if t is not None), None)
    if isinstance(out, Mapping):
        if isinstance(out.get("last_hidden_state"), torch.Tensor):
            return out["last_hidden_state"]
        return next((v for v in out.values() if isinstance(v, torch.Tensor)), None)
    return None


def token_mask(t: torch.Tensor, mask: torch.Tensor | None, kind: str = "", where: str = "") -> torch.Tensor | None:
    """The (rows, tokens) mask (nonzero: a real token) where a module's output `t` is token rows (rows,
    tokens, features), else None. `t` is token rows where it is 3-D and its (rows, tokens) is `mask`'s
    shape (the batch's attention mask or token ids), or where it is any other 3-D output but one of a
    torch *1d module (`kind`, its class: Conv1d, BatchNorm1d, MaxPool1d...), whose (rows, channels,
    length) is a 1-d map: a ViT's patches with no mask in the batch are token rows, every token real.
    Token rows of another length than a mask with padding (a model that adds a CLS token) are refused in
    one ConfigError line (`where`: the hook point as the block names it): which of them are padding is
    not known; where the mask has no padding, every token is real."""
    if t.dim() != 3:
        return None
    fits = mask is not None and mask.dim() == 2 and len(mask) == len(t)
    if fits and tuple(mask.shape) == tuple(t.shape[:2]):
        return mask
    if kind.endswith("1d"):
        return None
    if fits and not bool(mask.bool().all()):
        raise ConfigError(f"{where}: its token rows are {t.shape[1]} long and the batch's attention_mask "
                          f"{mask.shape[1]} (a model that adds tokens, a CLS): which of its tokens are padding is not "
                          f"known, and pooling would take them in; name a module whose tokens are the mask's, or give "
                          f"batches without padding")
    return torch.ones(t.shape[:2], dtype=torch.bool, device=t.device)


def module_kinds(taps: Taps) -> dict[str, str]:
    """{module name: its class's name} of the taps' modules (token_mask's `kind`)."""
    return {n: type(m).__name__ for n, m in taps.targets}


def refuse_non_finite(rows: torch.Tensor, items: torch.Tensor, where: str, needs: str) -> None:
    """One RunError line where a pooled output's rows (rows, ...) hold NaN or inf: `items[i]` is row i's item,
    `where` the hook point as the block names it (`probe.at: block2`), `needs` what needs finite rows."""
    if bool(torch.isfinite(rows.sum())):  # (one reduction: NaN and inf carry into the sum; a finite sum, every value)
        return
    bad = ~torch.isfinite(rows.reshape(len(rows), -1)).all(dim=1)  # (an inf sum of finite values passes here)
    if bool(bad.any()):
        item = int(items.cpu()[bad.cpu()][0])
        raise RunError(f"{where}'s pooled output holds NaN or infinite values in {int(bad.sum())} row(s) of this batch "
                       f"(the first of item {item}); {needs}, or find where the model overflows (its dtype, its inputs)")


def refuse_not_batch_first(t: torch.Tensor, items: torch.Tensor | None, key: str, name: str, needs: str) -> None:
    """One ConfigError line where a module's output `t` (2-D or more) does not have the batch's `items` on its
    first axis: an output the batch shares (a position table's (1, tokens, features)) or one over the batch's
    tokens flattened (a router's (batch x tokens, experts)) would be read as rows of other items (an IndexError,
    or a matrix over the wrong rows). `key`: the block's key (`probe.at`, `similarity.with.at`); `name`: the
    module; `needs`: what the kind needs instead. Nothing is asked where `items` is not known."""
    if items is None or t.dim() < 2 or t.shape[0] == len(items):
        return
    raise ConfigError(f"{key}: {name}'s output {tuple(t.shape)} has {t.shape[0]} rows on its first axis for a batch of "
                      f"{len(items)} items: not batch first (an output shared by the batch, such as a position table's "
                      f"(1, tokens, features), or over its tokens flattened, such as a router's (batch x tokens, "
                      f"experts)); {needs}")


def refuse_empty_items(real: torch.Tensor, items: torch.Tensor | None, where: str, pool: str, fix: str) -> None:
    """One RunError line where an item of token rows has no real token (its (rows, tokens) `real` mask all 0):
    `pool` (last, mean, max over the real tokens) has no value there, and a padding token's row (last), a
    row of zeros (mean) or -inf (max) would enter in its place. `items[i]`: row i's dataset item."""
    empty = ~real.bool().any(dim=1)
    if not bool(empty.any()):
        return
    rows = empty.nonzero().flatten().cpu()
    names = (items.cpu()[rows] if items is not None and len(items) == len(real) else rows).tolist()
    raise RunError(f"{where}: item(s) {names[:8]} of this batch have no real token (attention_mask all 0), so "
                   f"pool={pool} over their real tokens has no value (a padding token's features, or zeros, would "
                   f"enter as their row); {fix}")


class Taps:
    def __init__(self, model: nn.Module, patterns: Iterable[str], hook: str, where: str) -> None:
        self.targets = resolve_targets(model, patterns, hook=hook, where=where)
        self.names = [name for name, _ in self.targets]
        self.where = where
        self.out: dict[str, Any] = {}
        self.last = {name for name, m in self.targets if channels_last(m, model)}  # 4-D outputs made (batch, C, H, W)
        self.seq_first = {name for name, m in self.targets if declared_batch_first(m, name, model) is False}
        self.decoder = Decoder.of(model)  # an encoder-decoder's: its modules' tokens are the decoder's (hooks/sides.py)
        self.inside: tuple | None = None  # (mask, ids) of the decoder call in flight

    def mask(self, batch_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The token mask of the module whose hook runs now: the decoder's inside an encoder-decoder's decoder,
        else the batch's."""
        return batch_mask if self.inside is None else self.inside[0]

    @contextmanager
    def attached(self, make: Callable[[str, torch.Tensor], Any]) -> Iterator[None]:
        """The hooks on for one forward (what an earlier forward took is dropped); every handle removed
        after it, in reverse order, also when it fails."""
        handles = []
        self.out = {}
        try:
            for name, module in self.targets:
                handles.append(module.register_forward_hook(self._hook(name, make)))
            if self.decoder is not None:  # (after the taps' hooks: a tap at the decoder itself sees its tokens)
                handles.extend(self.decoder.attach(lambda mask, ids: setattr(self, "inside", (mask, ids)),
                                                   lambda: setattr(self, "inside", None)))
            yield
        finally:
            for h in reversed(handles):
                h.remove()
            self.inside = None

    def _hook(self, name: str, make: Callable[[str, torch.Tensor], Any]) -> Callable[..., None]:
        out, where = self.out, self.where

        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if name in out:
                raise ConfigError(f"{where}: {name} ran twice in one forward (a shared module): which call's output "
                                  f"to take is not defined; name a module that runs once per forward")
            t = output_tensor(output)
            if t is None:
                raise ConfigError(f"{where}: {name} gives no tensor ({type(output).__name__}); name a module whose "
                                  f"output is a tensor (python -m hookrun.modules lists them)")
            if t.dim() == 4 and name in self.last:  # channels last (timm's Swin): the channels to axis 1, as a map has them
                t = t.movedim(-1, 1)
            if t.dim() >= 3 and name in self.seq_first:  # (tokens, batch, ...): pooled over an item's tokens, not the batch
                t = t.transpose(0, 1)
            out[name] = make(name, t)

        return hook

    def follow_forward(self) -> None:
        """`names` (what `take` returns) in the order the last forward's outputs came: a block's after the
        modules inside it, where named_modules lists it before them (probe's and similarity's depth order)."""
        self.take()  # (one line where one did not run)
        self.names = list(self.out)

    def take(self) -> list[Any]:
        """Each module's rows of the last forward, in the modules' order; one line where one did not run."""
        missing = [n for n in self.names if n not in self.out]
        if missing:
            raise ConfigError(f"{self.where}: {', '.join(missing)} did not run in the model's forward; name a module "
                              f"the forward calls (python -m hookrun.modules lists them)")
        return [self.out[n] for n in self.names]
