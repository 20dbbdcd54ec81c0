"""Taps on a model's residual graph: each writer group's contribution, each reader group's input.

    wiring = find_wiring(model, "patching.graph")
    with wiring.tap(writer=lambda group, a: ..., reader=lambda group, x: x + delta, embed=lambda e: e):
        model(ids)

`writer(group, a)`: a layer's heads' own contributions `[batch, position, heads, d_model]` (the
merged heads' output projection split by head, without its bias), an MLP's output or the embedding
(`[batch, position, 1, d_model]`). `reader(group, x)` gets a reader group's input (the residual
stream before the norm, one copy per head for q/k/v) and returns the input the reader uses: the
gradient pass adds zeros that require grad, faithfulness rebuilds it. `embed(e)` replaces the
token embedding (EAP-IG's interpolation; the position embedding is the same on
both inputs, so the embed writer's clean-minus-corrupt difference is the token embedding's, as in
TransformerLens 4.3, whose embed node is hook_embed). Hooks are plain PyTorch hooks, removed
(and the TransformerLens flags restored) when the block ends, also after an exception.

TransformerLens HookedTransformer: its own hook points (hook_result, hook_q_input / k / v with
use_split_qkv_input, hook_mlp_in / out, the last hook_resid_post). HF GPT-2, GPT-NeoX / Pythia and
Llama-style models (edges/hf_layout.py): the per-head q/k/v inputs by recomputing the q/k/v projection
from the norm of a per-head copy of the block's input, the per-head contributions from the output
projection's input. Grouped-query attention: a key / value projection gives one output per query head
(its group's weights on that head's copy) and the attention uses them ungrouped. Gemma 2: a head's
contribution is its output projection's share before the post-attention norm (TransformerLens'
hook_result, as EAP-IG and MIB take it), the MLP's the post-feedforward norm's output; `post_norms`
names, per attention writer group, the norm (and the output projection's bias) that the heads' sum
goes through before it joins the residual stream, which faithfulness re-runs on a reader's mix of
live and ablated heads (edges/run.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError
from hookrun.runner.kinds.patching.edges.hf_layout import llama_layout

KINDS = ("q", "k", "v")


class Wiring:
    n_layers: int
    n_heads: int
    parallel: bool = False
    post_norms: dict  # writer group -> (norm, bias or None) applied to the group's sum (Gemma 2's post-attention norm)

    def __init__(self) -> None:
        self.post_norms = {}

    def hooks(self, embed: Any, writer: Any, reader: Any) -> list:  # (module, "pre" | "post", fn)
        raise NotImplementedError

    @contextmanager
    def tap(self, embed: Any = None, writer: Any = None, reader: Any = None):
        handles = []
        try:
            self.enter()
            for module, when, fn in self.hooks(embed, writer, reader):
                handles.append(module.register_forward_pre_hook(fn) if when == "pre" else module.register_forward_hook(fn))
            yield self
        finally:
            for h in reversed(handles):
                h.remove()
            self.exit()

    def enter(self) -> None:
        pass

    def exit(self) -> None:
        pass


class LensWiring(Wiring):
    """A TransformerLens HookedTransformer, through its own hook points."""

    FLAGS = ("use_split_qkv_input", "use_attn_result", "use_hook_mlp_in")

    def __init__(self, model: nn.Module, where: str) -> None:
        cfg = model.cfg
        super().__init__()
        self.model, self.cfg = model, cfg
        self.n_layers, self.n_heads = cfg.n_layers, cfg.n_heads
        self.parallel = bool(getattr(cfg, "parallel_attn_mlp", False))
        kv = getattr(cfg, "n_key_value_heads", None)
        if kv is not None and kv != cfg.n_heads:  # ungrouped: one key and one value input per query head (as MIB)
            if not hasattr(cfg, "ungroup_grouped_query_attention"):  # (TransformerLens 4's TransformerBridge)
                raise ConfigError(f"{where}: {type(model).__name__} has grouped-query attention ({kv} key/value heads "
                                  f"for {cfg.n_heads} query heads) and its config has no ungroup_grouped_query_attention, "
                                  f"so its hook_k_input / hook_v_input are per key/value head, not per query head as the "
                                  f"graph (and MIB) needs; give the HF model itself (a fresh one: booting a bridge "
                                  f"replaces its modules) or a TransformerLens 3 HookedTransformer")
            self.FLAGS = (*self.FLAGS, "ungroup_grouped_query_attention")
        if getattr(cfg, "attn_only", False):
            raise ConfigError(f"{where}: the HookedTransformer is attention-only (cfg.attn_only=True), but the residual "
                              f"graph has an MLP writer and reader in every layer; edges need a model with MLPs")
        post = [f for f in ("use_normalization_before_and_after",) if getattr(cfg, f, False)]
        if post or getattr(cfg, "original_architecture", None) in ("Olmo2ForCausalLM", "Olmo3ForCausalLM"):
            raise ConfigError(f"{where}: the HookedTransformer norms each attention and MLP output before it joins the "
                              f"residual stream ({post[0] if post else cfg.original_architecture}), which faithfulness "
                              f"must re-run per reader on the heads' mix; the graph does that on the HF model only: give "
                              f"the HF model (Gemma 2's post-norms are handled there)")

    def enter(self) -> None:
        self.saved = {f: getattr(self.cfg, f) for f in self.FLAGS}
        for f in self.FLAGS:
            setattr(self.cfg, f, True)

    def exit(self) -> None:
        for f, v in getattr(self, "saved", {}).items():
            setattr(self.cfg, f, v)

    def hooks(self, embed: Any, writer: Any, reader: Any) -> list:
        b, out = self.model.blocks, []
        if embed is not None:
            out.append((self.model.hook_embed, "post", lambda m, i, o: embed(o)))
        if writer is not None:
            out.append((self.model.hook_embed, "post", lambda m, i, o: writer(("embed",), o[:, :, None])))
            for layer, blk in enumerate(b):
                out.append((blk.attn.hook_result, "post", _put(writer, ("attn", layer), False)))
                out.append((blk.hook_mlp_out, "post", _put(writer, ("mlp", layer), True)))
        if reader is not None:
            for layer, blk in enumerate(b):
                for kind in KINDS:
                    out.append((getattr(blk, f"hook_{kind}_input"), "post", _read(reader, (kind, layer), False)))
                out.append((blk.hook_mlp_in, "post", _read(reader, ("mlp", layer), True)))
            out.append((b[-1].hook_resid_post, "post", _read(reader, ("logits",), True)))
        return out


def _put(writer: Any, group: tuple, single: bool):
    return lambda m, i, o: writer(group, o[:, :, None] if single else o)


def _read(reader: Any, group: tuple, single: bool):
    if single:
        return lambda m, i, o: reader(group, o[:, :, None])[:, :, 0]
    return lambda m, i, o: reader(group, o)


class HFWiring(Wiring):
    """HF GPT-2, GPT-NeoX and Llama-style decoders: modules found by name, per-head readers recomputed."""

    def __init__(self, arch: str, embed: nn.Module, layers: list, final_norm: nn.Module, n_heads: int,
                 parallel: bool = False, n_kv_heads: int | None = None) -> None:
        super().__init__()
        self.arch, self.embed_module, self.layers, self.final_norm = arch, embed, layers, final_norm
        self.post_norms = {("attn", layer): (blk["post_attn"], blk["o_proj"].bias) for layer, blk in enumerate(layers)
                           if blk.get("post_attn") is not None}
        self.n_layers, self.n_heads, self.parallel = len(layers), n_heads, parallel
        self.n_kv_heads = n_kv_heads or n_heads
        self.saved_groups: dict = {}  # attention module -> its num_key_value_groups while ungrouped

    def exit(self) -> None:
        for attn, groups in self.saved_groups.items():
            attn.num_key_value_groups = groups
        self.saved_groups = {}

    def hooks(self, embed: Any, writer: Any, reader: Any) -> list:
        out = []
        if embed is not None:
            out.append((self.embed_module, "post", lambda m, i, o: embed(o)))
        if writer is not None:
            out.append((self.embed_module, "post", lambda m, i, o: writer(("embed",), o[:, :, None])))
        for layer, blk in enumerate(self.layers):
            if writer is not None:  # (Gemma 2: the heads before the post-attention norm, self.post_norms)
                out.append((blk["o_proj"], "pre", self._heads_out(writer, layer, blk["o_proj"])))
                out.append((blk.get("post_mlp", blk["mlp"]), "post", _put(writer, ("mlp", layer), True)))
            if reader is not None:
                seen: dict = {}
                out.append((blk["ln1"], "pre", lambda m, args, seen=seen: seen.__setitem__("x", args[0])))
                for proj, kinds in blk["qkv"]:
                    out.append((proj, "post", self._qkv(reader, layer, blk["ln1"], proj, kinds, seen, blk.get("attn"))))
                out.append((blk["ln2"], "pre", lambda m, args, layer=layer: (reader(("mlp", layer), args[0][:, :, None])[:, :, 0],)))
        if reader is not None:
            out.append((self.final_norm, "pre", lambda m, args: (reader(("logits",), args[0][:, :, None])[:, :, 0],)))
        return out

    def _heads_out(self, writer: Any, layer: int, proj: nn.Module):
        H = self.n_heads

        def hook(m, args):
            z = args[0]
            B, P, _ = z.shape
            w = _weight_in_out(proj)  # [in = H*dh, out = d]
            zh = z.view(B, P, H, -1)
            writer(("attn", layer), torch.einsum("bphe,hed->bphd", zh, w.reshape(H, zh.shape[-1], w.shape[1])))
        return hook

    def _qkv(self, reader: Any, layer: int, ln: nn.Module, proj: nn.Module, kinds: tuple, seen: dict,
             attn: nn.Module | None = None):
        """The projection's output recomputed from the norm of each head's own (adjusted) copy of the input.
        A key or value projection shared by a group of query heads (grouped-query attention) gives one
        output per query head, from that head's own copy, and its attention module uses them ungrouped."""
        H, arch = self.n_heads, self.arch
        grouped = self.n_kv_heads != H and kinds[0] in ("k", "v")
        group_of = torch.arange(H) // (H // self.n_kv_heads)  # query head -> its key/value head (repeat_kv's order)

        def hook(m, args, output):
            x = seen["x"]
            B, P, d = x.shape
            copies = torch.stack([reader((k, layer), x[:, :, None].expand(B, P, H, d)) for k in kinds], 2)  # [B,P,K,H,d]
            normed = ln.forward(copies)  # (not ln(...): its hooks, ours included, fired on the real call)
            w = _weight_in_out(proj)  # [d, out]
            if grouped:
                dh = w.shape[1] // self.n_kv_heads
                idx = group_of.to(w.device)
                w3 = w.view(d, 1, self.n_kv_heads, dh)[:, :, idx]
                bias = None if proj.bias is None else proj.bias.view(1, self.n_kv_heads, dh)[:, idx]
                if attn not in self.saved_groups:
                    self.saved_groups[attn] = attn.num_key_value_groups
                attn.num_key_value_groups = 1  # (restored when the tap ends)
                res = torch.einsum("bpkhd,dkhe->bpkhe", normed, w3)
                return (res if bias is None else res + bias).reshape(B, P, -1).to(output.dtype)
            K, dh = len(kinds), w.shape[1] // (len(kinds) * H)
            if arch == "gpt_neox":  # columns ordered (head, kind, dh)
                w3 = w.view(d, H, K, dh).permute(0, 2, 1, 3)
                bias = None if proj.bias is None else proj.bias.view(H, K, dh).permute(1, 0, 2)
            else:  # (kind, head, dh)
                w3, bias = w.view(d, K, H, dh), (None if proj.bias is None else proj.bias.view(K, H, dh))
            res = torch.einsum("bpkhd,dkhe->bpkhe", normed, w3)
            if bias is not None:
                res = res + bias
            if arch == "gpt_neox":
                res = res.permute(0, 1, 3, 2, 4)
            return res.reshape(B, P, -1).to(output.dtype)
        return hook


def _weight_in_out(proj: nn.Module) -> torch.Tensor:
    """[in, out] whether a Conv1D (GPT-2: weight [in, out]) or a Linear (weight [out, in])."""
    return proj.weight if type(proj).__name__ == "Conv1D" else proj.weight.t()


def find_wiring(model: nn.Module, where: str) -> Wiring:
    if hasattr(model, "blocks") and hasattr(model, "cfg") and hasattr(model, "hook_dict"):
        return LensWiring(model, where)
    wiring = _hf_wiring(model, where)
    _one_block_per_layer(model, wiring.layers, where)
    return wiring


def _one_block_per_layer(model: nn.Module, layers: list, where: str) -> None:
    """Two layers that are one module (`transformer.h[1] = transformer.h[0]`: a shared or looped block) would
    get both layers' taps on each call, and the gradient pass failed in a line about the gradient path."""
    uses: dict = {}
    for layer, blk in enumerate(layers):
        for part in ("ln1", "o_proj", "mlp", "ln2"):
            uses.setdefault(id(blk[part]), []).append(layer)
    shared = next((at for at in uses.values() if len(at) > 1), None)
    if shared:
        name = next((n for n, m in model.named_modules() if id(m) in uses and uses[id(m)] == shared), "?")
        raise ConfigError(f"{where}: layers {', '.join(map(str, shared))} of {type(model).__name__} share one module "
                          f"({name}, called at each of those {len(shared)} layers: a shared or looped block); the edge "
                          f"graph needs each layer's own modules, so its edges are not defined")


def _hf_wiring(model: nn.Module, where: str) -> Wiring:
    cfg = getattr(model, "config", None)
    arch = getattr(cfg, "model_type", None)
    if arch == "gpt2":
        t = getattr(model, "transformer", model)
        layers = [{"ln1": b.ln_1, "qkv": [(b.attn.c_attn, KINDS)], "o_proj": b.attn.c_proj, "mlp": b.mlp, "ln2": b.ln_2}
                  for b in t.h]
        return HFWiring("gpt2", t.wte, layers, t.ln_f, cfg.n_head)
    if arch == "gpt_neox":
        t = getattr(model, "gpt_neox", model)
        layers = [{"ln1": b.input_layernorm, "qkv": [(b.attention.query_key_value, KINDS)], "o_proj": b.attention.dense,
                   "mlp": b.mlp, "ln2": b.post_attention_layernorm} for b in t.layers]
        return HFWiring("gpt_neox", t.embed_in, layers, t.final_layer_norm, cfg.num_attention_heads,
                        parallel=bool(cfg.use_parallel_residual))
    layout = llama_layout(model, where)
    if layout is not None:
        return HFWiring("llama", **layout)
    raise ConfigError(f"{where}: no residual graph found for {type(model).__name__}: it is not a TransformerLens "
                      f"HookedTransformer (blocks, cfg, hook_dict) nor an HF GPT-2, GPT-NeoX or Llama-style model "
                      f"(config.model_type {arch!r}); edges need per-head q/k/v inputs and per-head outputs")
