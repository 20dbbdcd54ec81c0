"""Rows on the fly: the run's own model over the run's own data, a module's output as SAE rows, no cache.

    rows = LiveRows(model, loader, spec, "transformer.h.3", batch_rows=4096, shuffle={"buffer_rows": 1 << 20, "seed": 0},
                    vectors="auto", device=torch.device("cpu"))
    x = next(rows)                 # torch.float32, (4096, d_in)

Each data batch runs one forward under no_grad, cut short right after module `at` (nothing after it
is computed). Its output (the first element of a tuple) becomes rows: a (sample, features) output
as it is; a (sample, token, features) output one row per real token (the call's attention mask:
padding never enters; a sequence-first module's (token, sample, features), batch_first=False, read as
(sample, token, features)); `vectors="channel"` (the block's `rows: channel`) a feature map's channel vector at each position. With
`shuffle`, rows fill a buffer of `buffer_rows`; a full buffer is permuted (numpy's generator seeded
with (seed, pass, window)) and handed out batch by batch, so memory is one buffer whatever the
budget; `shuffle=False` keeps the data's order. A pass is the loader's first `limit` batches (data.limit;
None: all of them); past its end the next pass starts (the run's loader in its own order again); every batch
holds exactly `batch_rows` rows. An item that raises is one RunError line naming its batch (loop.one_line_errors).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from hookrun.errors import ConfigError, close_matches
from hookrun.hooks.actions.batch_axis import declared_batch_first
from hookrun.hooks.early_stop import StopForward
from hookrun.hooks.plan import last_roles
from hookrun.hooks.plan_checks import ONCE_PER_FORWARD, refuse_alias
from hookrun.runner.kinds.sae.data import BatchStream


class LiveRows(BatchStream):
    """An endless iterator of float32 batches of a module's output over the run's data (see above)."""

    part: int | None = None  # 0 where the module's output is a tuple (its first element is trained on)

    def __init__(self, model: nn.Module, loader: Any, spec: Any, at: str, batch_rows: int, shuffle: dict | bool,
                 vectors: str, device: torch.device, limit: int | None = None) -> None:
        self.model, self.loader, self.spec, self.at, self.limit = model, loader, spec, at, limit
        self.batch_rows, self.shuffle, self.vectors, self.device = batch_rows, shuffle, vectors, device
        names = [n for n, _ in model.named_modules()]
        if at not in names:
            refuse_alias(model, at, "sae.at", then=ONCE_PER_FORWARD.format(w="sae.at"))  # (a second name: which module)
            near = close_matches(at, names)
            raise ConfigError(f"sae.at: the model has no module {at!r}" + (f"; did you mean {near[0]!r}?" if near else "")
                              + " (python -m hookrun.modules lists them)")
        self.module = model.get_submodule(at)
        self.last = "output" in last_roles(self.module, model)  # a channels-last map: its channels are its last axis
        self.seq_first = declared_batch_first(self.module, at, model) is False  # (tokens, batch, ...): batch_first=False
        self.epochs = 0
        self.batches = 0
        self.d_in = 0
        self._it: Iterator[torch.Tensor] | None = None
        self.first = self._rows_of(next(iter(self._calls())), whole=True)  # one forward: d_in, checks of the output
        self.d_in = self.first.shape[1]

    def why_not_finite(self) -> str:
        return f"the model's output at {self.at} holds them (its own values over the run's data)"

    def _calls(self) -> Iterator[Any]:
        from hookrun.runner.loop import one_line_errors

        for _, batch in itertools.islice(one_line_errors(self.loader), self.limit):  # (data.limit's batches, no more read)
            yield self.spec.split(batch).to(self.device)

    def _forward(self, call: Any, whole: bool = False) -> Any:
        """The module's output in the call's forward, cut short after it; `whole` runs the forward to its end
        to count the module's calls: one that runs twice (a shared or looped block) has no one output."""
        seen: list[Any] = []

        def grab(module: nn.Module, args: Any, output: Any) -> None:
            self.part = 0 if isinstance(output, tuple | list) else None  # (op: splice puts the SAE back with arg: 0)
            seen.append(output[0] if isinstance(output, tuple | list) else output)
            if not whole:
                raise StopForward

        handle = self.module.register_forward_hook(grab)
        try:
            with torch.no_grad():
                call.run(self.model)
        except StopForward:
            pass
        finally:
            handle.remove()
        if not seen or not isinstance(seen[0], torch.Tensor):
            raise ConfigError(f"sae.at: {self.at}'s output is {type(seen[0]).__name__ if seen else 'never produced'}, "
                              "not a tensor; give a module whose output is a tensor")
        if len(seen) > 1:
            raise ConfigError(f"sae.at: {self.at} runs {len(seen)} times in one forward (a shared module, or one called "
                              "in a loop): which call's output to train on is not defined; name a module that runs once "
                              "per forward (python -m hookrun.modules shows the calls)")
        return seen[0]

    def _rows_of(self, call: Any, whole: bool = False) -> torch.Tensor:
        out = self._forward(call, whole).detach()
        if self.seq_first and out.dim() >= 3:  # (tokens, batch, ...) to (batch, tokens, ...), as the attention mask has them
            out = out.transpose(0, 1)
        if out.dim() < 2:
            raise ConfigError(f"sae.at: {self.at}'s output has shape {tuple(out.shape)}, one number per sample, not a "
                              "vector: an SAE trains on vectors; give sae.at a module whose output holds a vector per "
                              "token or sample")
        self._check_leading(out, call)
        mask = call.attention_mask if call.attention_mask is not None else call.kwargs.get("attention_mask")
        if self.vectors == "channel":
            if isinstance(mask, torch.Tensor) and out.dim() == 3 and tuple(out.shape[:2]) == tuple(mask.shape):
                raise ConfigError(f"sae.rows: channel reads a feature map's channel vectors; {self.at}'s output "
                                  f"{tuple(out.shape)} is (sample, token, feature) under the attention mask: give rows: token")
            if out.dim() < 3:
                raise ConfigError(f"sae.rows: channel reads a feature map (sample, channel, positions...); "
                                  f"{self.at}'s output has shape {tuple(out.shape)}: give rows: token")
            if self.last and out.dim() == 4:  # (sample, H, W, C): timm's Swin, a Linear inside a ConvNeXt block
                return out.reshape(-1, out.shape[-1]).float().cpu()
            return out.movedim(1, -1).reshape(-1, out.shape[1]).float().cpu()
        if out.dim() == 2:
            return out.float().cpu()
        if out.dim() == 3:
            keep = torch.ones(out.shape[:2], dtype=torch.bool, device=out.device) if mask is None else mask.bool()
            return out[keep].float().cpu()
        raise ConfigError(f"sae.at: {self.at}'s output has shape {tuple(out.shape)}; an SAE trains on vectors: "
                          "give sae.rows=channel (with sae.budget) for a feature map")

    def _check_leading(self, out: torch.Tensor, call: Any) -> None:
        """One row per sample (and per token, against the call's attention mask): a broadcast output, such as a
        position embedding's [1, T, d] for a batch of 32, holds no row per sample."""
        mask = call.attention_mask if call.attention_mask is not None else call.kwargs.get("attention_mask")
        token = self.vectors != "channel" and out.dim() == 3 and isinstance(mask, torch.Tensor)
        want = tuple(mask.shape) if token else next((tuple(t.shape[:1]) for t in call.tensors() if t.dim()), None)
        if want is not None and tuple(out.shape[:len(want)]) != want:
            what = "sample and token (the attention mask's shape" if token else "sample (the batch's size"
            raise ConfigError(f"sae.at: {self.at}'s output has shape {tuple(out.shape)}, not one row per {what} "
                              f"is {list(want)}): a broadcast output, shared by the batch; give sae.at a module whose "
                              "output holds a vector per sample or token")

    def _passes(self) -> Iterator[torch.Tensor]:
        """Each pass's rows, in the data's order, a data batch at a time."""
        epoch = 0
        while True:
            self.epochs = epoch + 1
            if hasattr(getattr(self.loader, "sampler", None), "set_epoch"):
                self.loader.sampler.set_epoch(epoch)
            for call in self._calls():
                yield epoch, self._rows_of(call)
            epoch += 1

    def _stream(self) -> Iterator[torch.Tensor]:
        size = self.shuffle["buffer_rows"] if self.shuffle else self.batch_rows
        held: list[torch.Tensor] = []
        have, window = 0, 0
        for epoch, rows in self._passes():
            held.append(rows)
            have += len(rows)
            while have >= max(size, self.batch_rows):
                buf = torch.cat(held)
                take = buf[: max(size, self.batch_rows)]
                rest = buf[len(take):]
                held, have = ([rest] if len(rest) else []), len(rest)
                if self.shuffle:
                    perm = np.random.default_rng([self.shuffle["seed"], epoch, window]).permutation(len(take))
                    take = take[torch.from_numpy(perm)]
                    window += 1
                usable = len(take) - len(take) % self.batch_rows
                for lo in range(0, usable, self.batch_rows):
                    yield take[lo:lo + self.batch_rows]
                if usable < len(take):  # a partial batch goes back to the front of what is held
                    held.insert(0, take[usable:])
                    have += len(take) - usable
