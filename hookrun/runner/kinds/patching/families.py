"""The causal language models whose forward the suffix route (suffix.py) knows how to resume.

    family = find_family(model, "input")     # _TL / _GPT2, or None: not a model known to be causal
    kv, resid = family.base(ids)             # each block's keys and values and input, one forward
    h = family.run(ids[:, p0:], resid[L][:, p0:], L, family.prefix(kv, p0, copies))  # blocks L.. on p0..
    logits = family.head(h[:, -1:])          # the final norm (where not in h) and the unembedding

| family                          | detected by                                   | cache              |
|---------------------------------|-----------------------------------------------|--------------------|
| TransformerLens HookedTransformer | its class, cfg.attention_dir == "causal", absolute or rotary positions, no logit soft cap, one device | TransformerLensKeyValueCache (start_at_layer, stop_at_layer) |
| HF GPT-2 (GPT2LMHeadModel)      | its class, no cross-attention, blocks that return one tensor | DynamicCache (`cache` or `past_key_values`) |

Anything else (another HF family, a bidirectional encoder, a plain nn.Module) is None: its cells
take the full path. A family's keys and values are those its own cache holds after a forward of
the base input, so a resumed forward sees what a full one would.
"""

from __future__ import annotations

import inspect
import sys
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from hookrun.runner.calls import model_forward
from hookrun.runner.kinds.patching.stack import returning


def find_family(model: nn.Module, input_name: str) -> _TL | _GPT2 | None:
    tl = sys.modules.get("transformer_lens")
    try:  # TransformerLens 4 raises ImportError for HookedTransformer
        hooked = getattr(tl, "HookedTransformer", ()) if tl is not None else ()
    except ImportError:
        hooked = ()
    if hooked and isinstance(model, hooked) and input_name == "input":
        return _TL.check(model)
    gpt2 = sys.modules.get("transformers.models.gpt2.modeling_gpt2")
    if gpt2 is not None and type(model) is getattr(gpt2, "GPT2LMHeadModel", None) and input_name == "input_ids":
        return _GPT2.check(model)
    return None


def _keep_inputs(blocks: nn.ModuleList, resid: list) -> list:
    """Forward pre-hooks keeping each block's input (its first argument, or hidden_states)."""
    def keep(i: int):
        def fn(module: nn.Module, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else kwargs.get("hidden_states")
            resid[i] = x.detach() if isinstance(x, torch.Tensor) else None
        return fn
    return [b.register_forward_pre_hook(keep(i), with_kwargs=True) for i, b in enumerate(blocks)]


class _TL:
    """TransformerLens 3.x HookedTransformer: keys and values [batch, pos, head, d_head]."""

    blocks_name = "blocks"

    def __init__(self, model: nn.Module, cache_cls: Any) -> None:
        self.model, self.cache_cls = model, cache_cls
        self.blocks = model.blocks

    @classmethod
    def check(cls, model: nn.Module) -> _TL | None:
        cfg = model.cfg
        if (getattr(cfg, "attention_dir", None) != "causal" or cfg.positional_embedding_type not in ("standard", "rotary")
                or getattr(cfg, "output_logits_soft_cap", -1.0) > 0 or getattr(cfg, "n_devices", 1) != 1):
            return None
        tl = sys.modules["transformer_lens"]
        cache = getattr(tl, "TransformerLensKeyValueCache", None) or getattr(tl, "HookedTransformerKeyValueCache", None)
        if cache is None or not hasattr(cache, "init_cache"):
            return None
        return cls(model, cache)

    def base(self, ids: torch.Tensor) -> tuple[list, list]:
        cache = self.cache_cls.init_cache(self.model.cfg, ids.device, ids.shape[0])
        resid: list = [None] * len(self.blocks)
        handles = _keep_inputs(self.blocks, resid)
        try:
            model_forward(self.model, (ids,), dict(past_kv_cache=cache, attention_mask=torch.ones_like(ids),
                                                   stop_at_layer=len(self.blocks)))
        finally:
            for h in handles:
                h.remove()
        return [(e.past_keys, e.past_values) for e in cache.entries], resid

    def prefix(self, kv: list, p0: int, level: int, copies: int) -> Any:
        rows = kv[0][0].shape[0] * copies
        cache = self.cache_cls.init_cache(self.model.cfg, kv[0][0].device, rows)
        for i, ((k, v), entry) in enumerate(zip(kv, cache.entries, strict=True)):
            if i >= level:  # the layers below `level` do not run
                entry.past_keys, entry.past_values = k[:, :p0].repeat(copies, 1, 1, 1), v[:, :p0].repeat(copies, 1, 1, 1)
        cache.previous_attention_mask = torch.ones(rows, p0, dtype=torch.int, device=kv[0][0].device)
        cache.freeze()
        return cache

    def run(self, ids: torch.Tensor, x: torch.Tensor, level: int, cache: Any) -> torch.Tensor:
        """The residual after the last block at the suffix positions (before the final norm)."""
        return model_forward(self.model, (x,), dict(start_at_layer=level, stop_at_layer=len(self.blocks), past_kv_cache=cache))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        if self.model.cfg.normalization_type is not None:
            h = self.model.ln_final(h)
        return self.model.unembed(h)


class _GPT2:
    """transformers' GPT2LMHeadModel: keys and values [batch, head, pos, d_head] in a DynamicCache."""

    blocks_name = "transformer.h"

    def __init__(self, model: nn.Module, cache_arg: str, cache_cls: Any) -> None:
        self.model, self.cache_arg, self.cache_cls = model, cache_arg, cache_cls
        self.blocks = model.transformer.h

    @classmethod
    def check(cls, model: nn.Module) -> _GPT2 | None:
        if getattr(model.config, "add_cross_attention", False) or getattr(model.config, "is_encoder_decoder", False):
            return None
        params = inspect.signature(model.transformer.forward).parameters
        arg = next((a for a in ("cache", "past_key_values") if a in params), None)
        try:
            from transformers.cache_utils import DynamicCache
        except ImportError:
            return None
        return None if arg is None else cls(model, arg, DynamicCache)

    def base(self, ids: torch.Tensor) -> tuple[list, list]:
        resid: list = [None] * len(self.blocks)
        out_types: list = []
        handles = _keep_inputs(self.blocks, resid)
        handles.append(self.blocks[0].register_forward_hook(lambda m, a, o: out_types.append(type(o))))
        try:
            out = self.model.transformer(input_ids=ids, use_cache=True)
        finally:
            for h in handles:
                h.remove()
        if out_types != [torch.Tensor]:  # a block returning a tuple (older transformers): not resumed
            raise TypeError("a GPT-2 block returned a tuple")
        cache = getattr(out, self.cache_arg, None)
        layers = getattr(cache, "layers", None)
        if layers is None or len(layers) != len(self.blocks):
            raise TypeError("the cache does not hold one layer per block")
        return [(layer.keys, layer.values) for layer in layers], resid

    def prefix(self, kv: list, p0: int, level: int, copies: int) -> Any:
        cache = self.cache_cls()
        for i, (k, v) in enumerate(kv):  # every layer: the position count is read off layer 0
            cache.update(k[:, :, :p0].repeat(copies, 1, 1, 1), v[:, :, :p0].repeat(copies, 1, 1, 1), i)
        return cache

    def run(self, ids: torch.Tensor, x: torch.Tensor, level: int, cache: Any) -> torch.Tensor:
        """The last hidden state at the suffix positions (after ln_f)."""
        with _skip(self.blocks, level, x):
            out = self.model.transformer(input_ids=ids, use_cache=True, **{self.cache_arg: cache})
        return out.last_hidden_state

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(h)


def _skip(blocks: nn.ModuleList, level: int, x: torch.Tensor) -> AbstractContextManager:
    """Blocks below `level` return `x` (the input of block `level`) instead of running, their hooks too."""
    return returning((b, x) for b in blocks[:level])
