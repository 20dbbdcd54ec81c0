"""Which tokens each forward call inside `model.generate` processes, for the hooks of that call.

    with GenerationTracker(model, points, state, eos_ids=[2]) as tracker:
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20)
    order, sample, position, generated = tracker.rows()

`generate` calls the model once for the prompt (B, T) and once per new token (B, 1) with the KV
cache. A pre-hook on the whole model (registered first, so it runs before every other hook) reads
each call's `input_ids` and `attention_mask` and sets `state.call_tokens`: which of the call's tokens
are real (not padding, and of a sample that has not yet produced its end-of-sequence token), their
absolute positions in their sample, and whether the call processes generated tokens. Modify
actions read it for `positions:`, `record rows: token` to keep one row per real token. The call
counters of the hook points restart at every model call, so call 0 of a block is its first call
within one forward pass, as in a plain run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from hookrun.errors import RunError
from hookrun.hooks.events import StepState
from hookrun.hooks.points import HookPoint

PHASES = ("all", "prompt", "generated")


@dataclass
class TokenMap:
    """The tokens of one forward call, each (B, L) for a call over L tokens."""

    valid: torch.Tensor  # bool: a real token of a sample still generating
    position: torch.Tensor  # long: absolute position in its sample (0 = its first prompt token)
    generated: bool  # the call processes generated tokens (a new-token pass), not the prompt
    call: int  # 0: the prompt pass; k: the pass over the k-th new token
    _flat: torch.Tensor | None = None

    def fits(self, t: torch.Tensor) -> bool:
        """Whether `t` is (batch, tokens, ...) of this call."""
        return t.dim() >= 2 and tuple(t.shape[:2]) == tuple(self.valid.shape)

    def take(self, t: torch.Tensor, where: str) -> torch.Tensor:
        """The rows of the call's real tokens (`record rows: token`); the flat index of those tokens
        is computed once per call, for every record of it."""
        if not self.fits(t):
            raise RunError(f"{where}: record rows: token needs a (batch, tokens, ...) tensor, after select/reduce; it has "
                           f"shape {tuple(t.shape)} in a model call over {tuple(self.valid.shape)} tokens (generate runs the "
                           f"LM head on the last position only: record the block or final norm before it)")
        if self._flat is None:
            self._flat = self.valid.reshape(-1).nonzero().squeeze(1)
        return t.flatten(0, 1).index_select(0, self._flat.to(t.device))


class GenerationTracker:
    """A context manager: the pre-hook on the model that keeps `state.call_tokens` current."""

    def __init__(self, model: nn.Module, points: list[HookPoint], state: StepState, eos_ids: Iterable[int] = ()) -> None:
        self.model = model
        self.points = points
        self.state = state
        self.eos = sorted({int(e) for e in eos_ids})
        self._eos: torch.Tensor | None = None  # on the model's device
        self.maps: list[TokenMap] = []
        self._alive: torch.Tensor | None = None  # (B,) the samples that have not produced EOS
        self._real: torch.Tensor | None = None  # (B,) each prompt's real tokens
        self._prompt_len = 0
        self._handle = None

    def __enter__(self) -> GenerationTracker:
        self._handle = self.model.register_forward_pre_hook(self._pre, with_kwargs=True, prepend=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.state.call_tokens = None

    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        tokens = ids if isinstance(ids, torch.Tensor) else kwargs.get("inputs_embeds")
        if not isinstance(tokens, torch.Tensor) or tokens.dim() < 2:  # not a call over tokens
            self.state.call_tokens = None
            return
        batch, length = int(tokens.shape[0]), int(tokens.shape[1])
        mask = kwargs.get("attention_mask")
        has_mask = isinstance(mask, torch.Tensor) and mask.dim() == 2
        total = mask.shape[1] if has_mask else cached(kwargs) + length  # generate leaves out a mask of ones
        if total == length or self._alive is None or self._alive.shape[0] != batch:  # a fresh sequence: the prompt
            valid = mask.bool() if has_mask else torch.ones(batch, length, dtype=torch.bool, device=tokens.device)
            position = valid.long().cumsum(1) - 1
            self._prompt_len, self._real = total, position[:, -1] + 1
            self._alive = torch.ones(batch, dtype=torch.bool, device=tokens.device)
            self.maps.clear()
            tokens = TokenMap(valid, position, False, 0)
        else:  # the next token(s) of the same samples: generate's mask grows by ones, so no cumsum is needed
            if isinstance(ids, torch.Tensor) and self.eos:
                if self._eos is None or self._eos.device != ids.device:
                    self._eos = torch.tensor(self.eos, device=ids.device)
                last = ids[:, -1]
                hit = last == self._eos[0] if len(self.eos) == 1 else torch.isin(last, self._eos)
                self._alive = self._alive & ~hit
            done = total - length - self._prompt_len  # generated tokens before this call's
            position = (self._real + done).unsqueeze(1)
            valid = self._alive.unsqueeze(1)
            if length > 1:
                position = position + torch.arange(length, device=position.device)
                valid = valid.expand(batch, length)
            call = self.maps[-1].call + 1 if self.maps else 1
            tokens = TokenMap(valid, position, done >= 0, call)
        self.maps.append(tokens)
        self.state.call_tokens = tokens
        for point in self.points:
            point.reset()

    def rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The generation's token rows: (order, sample, position, generated).

        Rows are first gathered call by call, as `record rows: token` appends them; `order` sorts
        them by sample, then position, and sample/position/generated are already in that order
        (sample is the row's place in the batch)."""
        samples, positions, generated = [], [], []
        for m in self.maps:
            b, j = m.valid.nonzero(as_tuple=True)
            samples.append(b)
            positions.append(m.position[b, j])
            generated.append(torch.full_like(b, int(m.generated), dtype=torch.bool))
        if not samples:
            empty = torch.zeros(0, dtype=torch.long)
            return empty, empty, empty, empty.bool()
        sample, position, gen = torch.cat(samples), torch.cat(positions), torch.cat(generated)
        order = torch.argsort(sample * (int(position.max()) + 2 if len(position) else 1) + position, stable=True)
        return order, sample[order], position[order], gen[order]


def cached(kwargs: dict) -> int:
    """How many tokens the call's KV cache (`past_key_values`) already holds."""
    past = kwargs.get("past_key_values")
    if past is None:
        return 0
    if hasattr(past, "get_seq_length"):
        return int(past.get_seq_length())
    try:  # the legacy tuple of (key, value) per layer
        return int(past[0][0].shape[-2])
    except (IndexError, TypeError, AttributeError):
        return 0


def continues(args: tuple, kwargs: dict) -> bool:
    """Whether a model call continues a generation: its KV cache holds the tokens before."""
    mask = kwargs.get("attention_mask")
    ids = kwargs.get("input_ids", args[0] if args else None)
    if isinstance(ids, torch.Tensor) and isinstance(mask, torch.Tensor) and ids.dim() == 2 and mask.dim() == 2:
        return mask.shape[1] > ids.shape[1]
    return cached(kwargs) > 0
