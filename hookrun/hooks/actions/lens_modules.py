"""The logit lens's view of the model: the norm and unembed modules it names (found and checked
before any batch), and what the model's forward does to the unembed's output before returning it.

    norm = find_module(model, "transformer.ln_f", where, "norm")
    check_norm(norm, "transformer.ln_f", width, model, where)   # a norm, or one ConfigError line
    post = logit_transform(model)   # Gemma 2's softcap, Cohere's / Granite's scale; None: the output as it is

A norm is a module whose children hold no parameters, that keeps a (1, 2, width) input's shape
and gives the same output for 3x as for x (within a tolerance that allows for its eps and dtype):
LayerNorm, RMSNorm and TransformerLens' LayerNormPre are; a block, GELU, Dropout, Identity are not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError, article, close_matches


def find_module(model: nn.Module, name: Any, where: str, key: str) -> nn.Module:
    table = dict(model.named_modules())
    if not isinstance(name, str) or name not in table or not name:
        hint = close_matches(str(name), [n for n in table if n])
        raise ConfigError(f"{where}: logit_lens {key}={name!r} is not a module of {type(model).__name__}; "
                          f"{'closest: ' + ', '.join(hint) if hint else 'name one with python -m hookrun.modules'}")
    return table[name]


def linear_shape(unembed: nn.Module) -> tuple[int | None, int | None]:
    """(width in, vocabulary out) of an unembedding: nn.Linear, HF's Conv1D, TransformerLens' Unembed (W_U)."""
    if isinstance(getattr(unembed, "in_features", None), int):
        return unembed.in_features, getattr(unembed, "out_features", None)
    for name in ("W_U", "weight"):
        w = getattr(unembed, name, None)
        if isinstance(w, torch.Tensor) and w.dim() == 2:  # Conv1D and W_U: (in, out); a plain weight: (out, in)
            transposed = name == "W_U" or isinstance(getattr(unembed, "nf", None), int)
            return (int(w.shape[0]), int(w.shape[1])) if transposed else (int(w.shape[1]), int(w.shape[0]))
    return None, None


def check_unembed(unembed: nn.Module, name: str, model: nn.Module, where: str) -> None:
    """A module with a matrix, not an embedding (it reads ids, and runs first) or a norm; of the vocabulary of
    the model's output layer where it names one (Hugging Face's get_output_embeddings, TransformerLens' unembed)."""
    try:
        own = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else \
            getattr(model, "unembed", None)
    except (NotImplementedError, AttributeError):  # (a model class whose output layer is not named)
        own = None
    hint = f"; name the model's output layer, {next((n for n, m in model.named_modules() if m is own), '(lm_head)')}"
    matrix = any(p.dim() == 2 for p in unembed.parameters(recurse=False)) or linear_shape(unembed)[1] is not None
    if isinstance(unembed, nn.Embedding) or not matrix:
        raise ConfigError(f"{where}: logit_lens unembed={name!r} is {article(type(unembed).__name__)}, not an unembedding "
                          f"(a matrix from the model's width to its vocabulary, run after the hooked point){hint}")
    vocab, want = linear_shape(unembed)[1], linear_shape(own)[1] if isinstance(own, nn.Module) else None
    if None not in (vocab, want) and vocab != want:
        raise ConfigError(f"{where}: logit_lens unembed={name!r} gives {vocab} outputs, but the model's vocabulary "
                          f"has {want} tokens{hint}")


def check_norm(norm: nn.Module, name: Any, width: int | None, model: nn.Module, where: str) -> None:
    """A norm: its children hold no parameters (TransformerLens' norms hold hook points), it keeps a
    (1, 2, width) input's shape and is scale invariant (norm(3x) = norm(x)); a block, an activation,
    a dropout or an identity given as `norm` is one line naming the norms (only modules that pass
    these checks: a wrapper such as TransformerLens 4's NormalizationBridge names the norm inside it)."""
    if is_norm(norm, width):
        return
    named = [(n, m) for n, m in model.named_modules() if m is not norm and n
             and ("norm" in type(m).__name__.lower() or n.endswith(("ln_f", "norm")))]
    inside = [n for n, m in named if "norm" in type(norm).__name__.lower() and n.startswith(f"{name}.") and is_norm(m, width)]
    norms = inside[:1] + [n for n, m in named if n not in inside and is_norm(m, width)][-3:]
    raise ConfigError(f"{where}: logit_lens norm={name!r} is {article(type(norm).__name__)}, not a norm (a norm keeps its "
                      f"(batch, tokens, width) input's shape, gives the same output for 3x as for x, and holds no "
                      f"layers); name the model's final norm" + (f", e.g. {', '.join(norms)}" if norms else ""))


def is_norm(norm: nn.Module, width: int | None) -> bool:
    """No child holds parameters, and (where the width is known) scale_invariant."""
    if any(p.numel() for c in norm.children() for p in c.parameters()):
        return False
    return width is None or scale_invariant(norm, width)


def scale_invariant(norm: nn.Module, width: int) -> bool:
    """norm(3x) equals norm(x) on a random (1, 2, width) x of unit variance, and keeps its shape.
    A norm's eps shifts it by less than eps (relative), its dtype by a few of its rounding steps."""
    p = next(norm.parameters(), None)
    dtype = p.dtype if p is not None and p.is_floating_point() else torch.float32
    x = torch.randn(1, 2, width, generator=torch.Generator().manual_seed(0)).to(p.device if p is not None else None, dtype)
    eps = next((float(v) for k in ("eps", "variance_epsilon", "epsilon", "layer_norm_eps")
                if isinstance(v := getattr(norm, k, None), int | float) and not isinstance(v, bool)), 1e-5)
    try:
        with torch.no_grad():
            y, y3 = norm.forward(x), norm.forward(3 * x)
    except Exception:  # whatever a module that is no norm raises on a (1, 2, width) input
        return False
    if not isinstance(y, torch.Tensor) or not isinstance(y3, torch.Tensor) or tuple(y.shape) != tuple(x.shape) \
            or tuple(y3.shape) != tuple(x.shape):
        return False
    y, y3 = y.double(), y3.double()
    tol = 1e-3 + 16 * torch.finfo(dtype).eps + min(abs(eps), 1.0)
    return bool(torch.isfinite(y).all()) and float((y3 - y).abs().max()) <= tol * max(float(y.abs().max()), 1e-12)


# What a model class's forward does to the unembed's output before returning it (read in transformers'
# modeling files): (the classes, the config attribute, the operation). Other models return it as it is.
SOFTCAP = lambda c: lambda z: torch.tanh(z / c) * c  # noqa: E731  (logits / c, tanh, * c: Gemma 2's order)
TRANSFORMS: list[tuple[tuple[str, ...], Callable[[nn.Module], Any], Callable[[float], Callable]]] = [
    (("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3nForCausalLM", "VaultGemmaForCausalLM"),
     lambda m: getattr(m.config, "final_logit_softcapping", None), SOFTCAP),
    (("Gemma3nForConditionalGeneration", "PaliGemmaForConditionalGeneration"),
     lambda m: getattr(m.config.get_text_config(), "final_logit_softcapping", None), SOFTCAP),
    (("CohereForCausalLM", "Cohere2ForCausalLM"), lambda m: getattr(m, "logit_scale", None), lambda s: lambda z: z * s),
    (("GraniteForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM", "GraniteMoeHybridForCausalLM"),
     lambda m: getattr(m.config, "logits_scaling", None), lambda s: lambda z: z / s),
    (("HookedTransformer",),  # TransformerLens: cfg.output_logits_soft_cap > 0 caps the unembed's output
     lambda m: (lambda c: c if isinstance(c, int | float) and c > 0 else None)(getattr(m.cfg, "output_logits_soft_cap", 0)),
     SOFTCAP),
]


def logit_transform(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The model's own step from the unembed's output to its output logits (Gemma 2/3's
    final_logit_softcapping, Cohere's logit_scale, Granite's logits_scaling), applied as its forward
    does, in the logits' dtype; None where the model returns the unembed's output as it is. A
    TransformerLens 4 TransformerBridge takes the step of the HF model it wraps (its original_model)."""
    names = {c.__name__ for c in type(model).__mro__}
    inner = getattr(model, "original_model", None)  # TransformerLens 4's TransformerBridge runs its HF model's forward
    if "TransformerBridge" in names and isinstance(inner, nn.Module) and inner is not model:
        return logit_transform(inner)
    for classes, read, make in TRANSFORMS:
        if names.intersection(classes):
            value = read(model)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                return make(float(value))
    return None
