"""Where a Hugging Face Llama-style decoder keeps the modules of its residual graph, or one ConfigError.

    layout = llama_layout(model, "patching.graph=auto")   # None: not a Llama-style config at all
    HFWiring("llama", **layout)                             # edges/wiring.py taps these modules

Known: Llama, Mistral and Qwen2 (pre-norm blocks: `input_layernorm` before attention,
`post_attention_layernorm` before the MLP) and Gemma 2 (`input_layernorm`, then
`post_attention_layernorm` on the attention's output before it joins the residual stream,
`pre_feedforward_layernorm` before the MLP and `post_feedforward_layernorm` on its output), each
with grouped-query attention or not. Any other model type, or a known one whose decoder layer or
attention has modules the graph does not know or lacks one it needs, is refused in one line
naming them: a norm in an unexpected place would make the scores silently wrong.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from hookrun.errors import ConfigError

ATTN = {"q_proj", "k_proj", "v_proj", "o_proj"}
PRE_NORM = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
SANDWICH = PRE_NORM | {"pre_feedforward_layernorm", "post_feedforward_layernorm"}
KNOWN = {"llama": PRE_NORM, "mistral": PRE_NORM, "qwen2": PRE_NORM, "gemma2": SANDWICH}
KNOWN_LINE = "HF gpt2, gpt_neox, llama, mistral, qwen2 and gemma2 models and TransformerLens HookedTransformers"


def llama_layout(model: nn.Module, where: str) -> dict | None:
    """HFWiring's arguments for a known Llama-style model; None for a config without query/key-value head counts."""
    cfg = getattr(model, "config", None)
    arch = getattr(cfg, "model_type", None)
    if arch is None or not all(hasattr(cfg, k) for k in ("num_attention_heads", "num_key_value_heads")):
        return None
    name = f"{type(model).__name__} (model_type {arch!r})"
    t = getattr(model, "model", model)
    missing = [k for k in ("embed_tokens", "layers", "norm") if not hasattr(t, k)]
    if missing:
        raise ConfigError(f"{where}: {name} has no model.{', model.'.join(missing)}: the residual graph does not know "
                          f"its layout; it knows {KNOWN_LINE}")
    layers = list(t.layers)
    want = KNOWN.get(arch)
    if want is None:
        diff = _differences(layers[0], PRE_NORM) or "its layer's modules are named as Llama's, but where its norms sit is not known"
        raise ConfigError(f"{where}: {name}: the residual graph does not know its attention and norms ({diff}); "
                          f"it knows {KNOWN_LINE}")
    diff = _differences(layers[0], want)
    if diff:
        raise ConfigError(f"{where}: {name}: the residual graph does not know this decoder layer: {diff}")
    H, kv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
    if kv < 1 or H % kv:
        raise ConfigError(f"{where}: {name} has {H} query heads and {kv} key/value heads: the query heads must split "
                          f"into equal groups, one per key/value head")
    sandwich = want is SANDWICH
    blocks = []
    for b in layers:
        a = b.self_attn
        blk: dict[str, Any] = {"ln1": b.input_layernorm, "attn": a, "o_proj": a.o_proj, "mlp": b.mlp,
                               "qkv": [(a.q_proj, ("q",)), (a.k_proj, ("k",)), (a.v_proj, ("v",))]}
        if sandwich:
            blk.update(ln2=b.pre_feedforward_layernorm, post_attn=b.post_attention_layernorm,
                       post_mlp=b.post_feedforward_layernorm)
        else:
            blk["ln2"] = b.post_attention_layernorm
        blocks.append(blk)
    return {"embed": t.embed_tokens, "layers": blocks, "final_norm": t.norm, "n_heads": H, "n_kv_heads": kv}


def _differences(layer: nn.Module, want: set) -> str:
    """What a decoder layer lacks or has beyond `want` (and its attention beyond q/k/v/o projections)."""
    have = {n for n, _ in layer.named_children()}
    attn = getattr(layer, "self_attn", None)
    have_attn = set() if attn is None else {n for n, _ in attn.named_children()}
    parts = []
    if want - have:
        parts.append(f"it lacks {', '.join(sorted(want - have))}")
    if have - want:
        parts.append(f"it has {', '.join(sorted(have - want))}, which the graph does not know")
    if attn is not None and ATTN - have_attn:
        parts.append(f"its self_attn lacks {', '.join(sorted(ATTN - have_attn))}")
    if attn is not None and have_attn - ATTN:
        parts.append(f"its self_attn has {', '.join(sorted(have_attn - ATTN))}, which the graph does not know")
    return "; ".join(parts)
