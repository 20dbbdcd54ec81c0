"""The decoder's tokens of an encoder-decoder model: its own mask, not the batch's.

An encoder-decoder transformers model (T5, BART, Marian, ...: `config.is_encoder_decoder`) runs its
encoder over `input_ids` (the batch's `attention_mask`) and its decoder over `decoder_input_ids`, with a
mask of its own (`decoder_attention_mask`; without one every decoder token is real). A module inside
the decoder has the decoder's tokens, so its padding is the decoder mask's, whatever the lengths:

    side = Decoder.of(model)                    # None for a model without an encoder-decoder config
    with side.tracking(enter, leave):           # enter(mask, ids) as the decoder starts, leave() as it ends
        model(**batch)

`mask` is the decoder call's `attention_mask` (or ones over its `input_ids` / `inputs_embeds`), `ids` its
`input_ids` (None where it runs on embeddings). A decoder call that continues a generation (its KV cache
holds the tokens before) is left to hooks/tokens.py's CallTracker: enter is not called then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from hookrun.hooks.tokens import TokenMap, continues, token_input


class Decoder:
    def __init__(self, name: str, module: nn.Module) -> None:
        self.name = name
        self.module = module

    @classmethod
    def of(cls, model: nn.Module | None) -> Decoder | None:
        cfg = getattr(model, "config", None)
        if model is None or not getattr(cfg, "is_encoder_decoder", False) or not callable(getattr(model, "get_decoder", None)):
            return None
        try:
            decoder = model.get_decoder()
        except (AttributeError, NotImplementedError, TypeError):
            return None
        name = next((n for n, m in model.named_modules() if m is decoder), None)
        return None if name is None or name == "" else cls(name, decoder)

    def covers(self, module: str) -> bool:
        """Whether the module path (or op site MODULE/FN) lies inside the decoder."""
        module = module.split("/")[0]
        return module == self.name or module.startswith(self.name + ".")

    @contextmanager
    def tracking(self, enter: Callable[[torch.Tensor, torch.Tensor | None], None],
                 leave: Callable[[], None]) -> Iterator[None]:
        handles = self.attach(enter, leave)
        try:
            yield
        finally:
            for h in reversed(handles):
                h.remove()

    def attach(self, enter: Callable[[torch.Tensor, torch.Tensor | None], None], leave: Callable[[], None]) -> list:
        """The pre-hook (first of the decoder's) and the forward hook (to be registered after the hook
        points' own, so a hook at the decoder itself still sees its tokens); their handles."""
        entered = []

        def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
            tokens = token_input(args, kwargs)
            if tokens is None or tokens.dim() < 2 or continues(args, kwargs):
                return
            mask = kwargs.get("attention_mask")
            if not (isinstance(mask, torch.Tensor) and tuple(mask.shape) == tuple(tokens.shape[:2])):
                mask = torch.ones(tokens.shape[:2], dtype=torch.long, device=tokens.device)
            ids = kwargs.get("input_ids", args[0] if args else None)
            entered.append(True)
            enter(mask, ids if isinstance(ids, torch.Tensor) else None)

        def post(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            if entered:
                entered.pop()
                leave()

        return [self.module.register_forward_pre_hook(pre, with_kwargs=True, prepend=True),
                self.module.register_forward_hook(post, with_kwargs=True, always_call=True)]


def decoder_calls(state: Any) -> tuple[Callable[[torch.Tensor, torch.Tensor | None], None], Callable[[], None]]:
    """HookSession's enter and leave for Decoder.attach: while the decoder runs, the step's (a
    StepState's) attention mask and call TokenMap are the decoder's, then the batch's again."""
    outer: list = [None]

    def enter(mask: torch.Tensor, ids: torch.Tensor | None) -> None:
        outer[0] = (state.attention_mask, state.call_tokens)
        state.attention_mask = mask
        state.call_tokens = TokenMap.of_batch(mask, provisional=False)
        state.call_tokens.decoder = True
        state.calls.append(state.call_tokens)

    def leave() -> None:
        state.attention_mask, state.call_tokens = outer[0]

    return enter, leave
