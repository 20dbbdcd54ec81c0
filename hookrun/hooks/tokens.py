"""Which tokens each model call processes: one TokenMap per call, in every mode.

    state.calls = [TokenMap.of_batch(attention_mask)]      # a plain forward: one call (HookSession.begin_step)
    with CallTracker(model, points, state, eos_ids=[2]):    # generate: a map per call (prompt, each new token)
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20)
    columns = token_columns(captures, state, with_generated=True)   # the step's /samples/token_* columns

A plain forward is a generation with one model call, so file runs, generate mode and
`hookrun.capture` share this map: `record rows: token` takes a call's real tokens with
`state.call_tokens.take(...)`, and the loop (and Captured) turn the step's maps into the token-row
columns with token_columns(), which also puts rows gathered call by call in (sample, position) order. A token's position counts its sample's real tokens, so
left and right padding give the same positions.

Inside `generate` the model runs once for the prompt (B, T) and once per new token (B, 1) with the
KV cache. CallTracker, a pre-hook on the whole model registered first, reads each call's
`input_ids` and `attention_mask` and sets the call's map: which of its tokens are real (not
padding, and of a sample that has not yet produced its end-of-sequence token), their positions,
and whether the call processes generated tokens (`positions:` of the modify actions reads that).
The call counters of the hook points restart at every model call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hookrun.errors import RunError
from hookrun.hooks import HookPoint, StepState
from hookrun.store.records import Capture

PHASES = ("all", "prompt", "generated")


@dataclass
class TokenMap:
    """The tokens of one model call: (B, L) masks, or None until the first (B, L, ...) tensor is
    seen where the batch has no attention mask (every token is then real)."""

    valid: torch.Tensor | None  # bool: a real token (of a sample still generating)
    position: torch.Tensor | None  # long: its position among its sample's real tokens
    generated: bool = False  # the call processes generated tokens (a new-token pass), not the prompt
    call: int = 0  # 0: the prompt pass (a plain forward); k: the pass over the k-th new token
    provisional: bool = False  # made by begin_step; a CallTracker replaces it at the model call
    decoder: bool = False  # an encoder-decoder's decoder call: its decoder_input_ids (hooks/sides.py)
    _flat: torch.Tensor | None = None

    @classmethod
    def of_batch(cls, mask: torch.Tensor | None, provisional: bool = True) -> TokenMap:
        """A plain forward's map, from the batch's attention mask (None: every token is real)."""
        if mask is None:
            return cls(None, None, provisional=provisional)
        valid = mask.to(torch.bool)
        return cls(valid, valid.long().cumsum(1) - 1, provisional=provisional)

    def fits(self, t: torch.Tensor, batch_size: int) -> bool:
        """Whether `t` is (batch, tokens, ...) of this call, or those flattened to (batch*tokens, ...)."""
        if self.valid is None:
            return t.dim() >= 2 and t.shape[0] == batch_size
        return (t.dim() >= 2 and tuple(t.shape[:2]) == tuple(self.valid.shape)) or (
            t.dim() >= 1 and t.shape[0] == self.valid.numel())

    def take(self, t: torch.Tensor, batch_size: int, role: str, where: str) -> torch.Tensor:
        """The rows of the call's real tokens, in order (sample, position): a view where every token
        is real (no mask, or a mask of ones), else a gather."""
        if self.valid is None and t.dim() >= 2 and t.shape[0] == batch_size:  # no mask: this tensor's tokens
            self.valid = torch.ones(t.shape[:2], dtype=torch.bool, device=t.device)
            self.position = torch.arange(t.shape[1], device=t.device).expand(t.shape[:2])
        if self.valid is None or not self.fits(t, batch_size):
            want = (f"(batch {batch_size}, tokens)" if self.valid is None else
                    f"the {'model call' if self.call else 'attention mask'}'s {tuple(self.valid.shape)}")
            hint = (" (generate runs the LM head on the last position only: record the block or final norm before it)"
                    if self.call or self.generated else "")
            raise RunError(f"{where}: rows: token needs {role} as (batch, tokens, ...) matching {want}, after "
                           f"select/reduce; it has shape {tuple(t.shape)}{hint}")
        if t.dim() < 2 or tuple(t.shape[:2]) != tuple(self.valid.shape):  # (batch*tokens, ...)
            t = t.reshape(*self.valid.shape, *t.shape[1:])
        if self._flat is None or self._flat.device != t.device:
            self._flat = self.valid.to(t.device).reshape(-1).nonzero().squeeze(1)
        rows = t.flatten(0, 1)
        if len(self._flat) == len(rows):  # every token is real, already in order: a view (the record's snapshot copies)
            return rows
        return rows.index_select(0, self._flat)


@dataclass
class TokenRows:
    columns: tuple[np.ndarray, ...]  # (dataset sample index, position[, generated as uint8]) per token row
    order: torch.Tensor | None  # sorts rows gathered call by call by (sample, position); None: already so


def step_token_rows(maps: list[TokenMap], sample_index: torch.Tensor | None, with_generated: bool) -> TokenRows | None:
    """The token rows of one step's model calls (None where no call's tokens were known)."""
    known = [m for m in maps if m.valid is not None]
    if not known:
        return None
    samples, positions, generated = [], [], []
    for m in known:
        b, j = m.valid.nonzero(as_tuple=True)
        samples.append(b.cpu())
        positions.append(m.position[b, j].cpu())
        generated.append(torch.full((len(b),), m.generated, dtype=torch.bool))
    sample, position, gen = torch.cat(samples), torch.cat(positions), torch.cat(generated)
    order = None
    if len(known) > 1 and len(position):
        order = torch.argsort(sample * (int(position.max()) + 2) + position, stable=True)
        sample, position, gen = sample[order], position[order], gen[order]
    index = sample_index[sample] if sample_index is not None else sample
    columns = (index.numpy().astype(np.int64), position.numpy().astype(np.int64))
    return TokenRows(columns + ((gen.numpy().astype(np.uint8),) if with_generated else ()), order)


def token_columns(captures: list[Capture], state: StepState, with_generated: bool) -> tuple | None:
    """The step's token map (one TokenMap per model call, hookrun.hooks.tokens) as the columns of
    /samples/token_*, with every token-row capture put in its order (sample, then position);
    None where nothing was recorded per token."""
    token_caps = [c for c in captures if c.tokens]
    sides = {c.decoder for c in token_caps}
    if len(sides) > 1:
        enc, dec = (next(c.key.module for c in token_caps if c.decoder == s) for s in (False, True))
        raise RunError(f"record rows: token at {enc} (the encoder's tokens) and at {dec} (the decoder's) in one run: their "
                       f"tokens differ and a file holds one token map (/samples/token_*); record them in two runs")
    maps = [m for m in state.calls if m.decoder in sides]
    rows = step_token_rows(maps, state.sample_index, with_generated) if token_caps else None
    if rows is None:
        return None
    n = len(rows.columns[0])
    for cap in token_caps:
        if cap.value.shape[0] != n:
            raise RunError(f"{cap.key.path}: record rows: token got {cap.value.shape[0]} rows in a batch of {n} tokens; "
                           f"hook a module that runs once at every model call")
        if rows.order is not None:
            cap.value = cap.value[rows.order.to(cap.value.device)]
    return rows.columns


class CallTracker:
    """A context manager: the pre-hook on the model that gives every model call its TokenMap
    (state.call_tokens, appended to state.calls) and restarts the points' call counters."""

    def __init__(self, model: nn.Module, points: list[HookPoint], state: StepState, eos_ids: Iterable[int] = ()) -> None:
        self.model = model
        self.points = points
        self.state = state
        self.eos = sorted({int(e) for e in eos_ids})
        self._eos: torch.Tensor | None = None  # on the model's device
        self._alive: torch.Tensor | None = None  # (B,) the samples that have not produced EOS
        self._real: torch.Tensor | None = None  # (B,) each prompt's real tokens
        self._prompt_len = 0
        self._calls = 0  # model calls of the generation in flight
        self._handle = None

    def __enter__(self) -> CallTracker:
        self._handle = self.model.register_forward_pre_hook(self._pre, with_kwargs=True, prepend=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        tokens = token_input(args, kwargs)
        if tokens is None or tokens.dim() < 2:  # not a call over tokens: the batch's map stays
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
            self._calls = 0
            new = TokenMap(valid, position)
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
            self._calls += 1
            new = TokenMap(valid, position, done >= 0, self._calls)
        calls = self.state.calls
        if calls and calls[-1].provisional:  # the step's first model call: its map replaces begin_step's
            calls[-1] = new
        else:
            calls.append(new)
        self.state.call_tokens = new
        for point in self.points:
            point.reset()


def token_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The tensor a model call's tokens are counted on: its input_ids (keyword, or the first positional
    argument), else its inputs_embeds; None where neither is a tensor."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    tokens = ids if isinstance(ids, torch.Tensor) else kwargs.get("inputs_embeds")
    return tokens if isinstance(tokens, torch.Tensor) else None


def cached(kwargs: dict) -> int:
    """How many tokens the call's KV cache already holds: `cache` (transformers 5), `past_key_values`
    (4.x), else the first of its `cache_position`s."""
    past = next((kwargs[k] for k in ("cache", "past_key_values") if kwargs.get(k) is not None), None)
    if past is None:
        where = kwargs.get("cache_position")
        return int(where.reshape(-1)[0]) if isinstance(where, torch.Tensor) and where.numel() else 0
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
