"""Edges on Llama-, Qwen2-, Mistral- and Gemma 2-shaped HF models (grouped-query attention, multi-query
attention, Gemma 2's post-norms) and on a TransformerLens HookedTransformer with n_key_value_heads.

The reference is a forward written here from the models' weights (the norms, MLPs, rotary embedding
and lm_head called directly; attention, heads and the residual sums by hand), in which every reader
input is its own leaf: each query head's q, k and v input is a copy of the residual stream, normed
and projected with its group's key / value weights, so d metric / d copy is the gradient through that
query head's use of the shared key and value (MIB's ungrouping). A Gemma 2 head's writer is its output
projection's share before the post-attention norm (TransformerLens' hook_result, EAP-IG's and MIB's
writer); the MLP's writer the post-feedforward norm's output; the MLP's reader the residual stream before
pre_feedforward_layernorm. EAP: score = (a_clean[w] - a_corrupt[w]) . d metric / d input[r] on the
corrupted run, by torch.autograd.grad, one item at a time. Ablating a Gemma 2 head for a reader re-runs
the post-attention norm on that reader's mix of live and corrupted heads (EAP-IG's evaluate_graph).
"""

# ruff: noqa: B023  (the reference closures are used within the loop iteration that defines them)
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from edge_graph import feeds, graph_labels, prompt_pairs

import hookrun
from hookrun.errors import ConfigError
from hookrun.runner.kinds.patching.edges.graph import find_graph

V, L, H, T, D, DH = 50, 2, 4, 6, 32, 8


def build(kind: str, kv: int):
    """A tiny random model of the HF class, eager attention, weights large enough that heads differ."""
    import transformers as tr

    common = dict(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=kv,
                  head_dim=DH, intermediate_size=64, max_position_embeddings=32, initializer_range=0.3)
    cfg = {"llama": lambda: tr.LlamaConfig(**common),
           "qwen2": lambda: tr.Qwen2Config(**common),  # q/k/v biases
           "mistral": lambda: tr.MistralConfig(**common, sliding_window=16),
           "gemma2": lambda: tr.Gemma2Config(**common, sliding_window=16, query_pre_attn_scalar=DH)}[kind]()
    cls = {"llama": tr.LlamaForCausalLM, "qwen2": tr.Qwen2ForCausalLM, "mistral": tr.MistralForCausalLM,
           "gemma2": tr.Gemma2ForCausalLM}[kind]
    torch.manual_seed(0)
    net = cls._from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0, 0.3)
    return net


@pytest.fixture(scope="module")
def items():
    return prompt_pairs(V, T, seed=1, at=2, shift=7, clean="input_ids")


def forward(net, ids, reader=lambda name, x: x, record=lambda name, a: None, embed=None):
    """The model's logits [T, V], written out: reader(name, residual) gives each reader's input; `embed`
    replaces the token embedding (EAP-IG's interpolation)."""
    cfg, t = net.config, net.model
    gemma = cfg.model_type == "gemma2"
    rope = sys.modules[type(t.layers[0].self_attn).__module__].apply_rotary_pos_emb
    kv = cfg.num_key_value_heads
    x = t.embed_tokens(ids[None]) if embed is None else embed  # (Gemma 2's module multiplies by sqrt(d_model))
    record("embed", x[0])
    cos, sin = t.rotary_emb(x, torch.arange(T)[None])
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    for layer, b in enumerate(t.layers):
        a = b.self_attn

        def proj(kind, h):
            lin = {"q": a.q_proj, "k": a.k_proj, "v": a.v_proj}[kind]
            g = h if kind == "q" else h // (H // kv)  # query head h uses key/value head h // group size
            normed = b.input_layernorm(reader(f"L{layer}.H{h}.{kind}", x))
            out = normed @ lin.weight[g * DH:(g + 1) * DH].T
            return out if lin.bias is None else out + lin.bias[g * DH:(g + 1) * DH]

        q, k, v = (torch.stack([proj(kind, h) for h in range(H)], 1) for kind in "qkv")  # [1, H, T, DH]
        q, k = rope(q, k, cos, sin)
        s = q @ k.transpose(-1, -2) * a.scaling
        if gemma and cfg.attn_logit_softcapping:
            s = torch.tanh(s / cfg.attn_logit_softcapping) * cfg.attn_logit_softcapping
        z = torch.softmax(s.masked_fill(causal, float("-inf")), -1) @ v  # [1, H, T, DH]
        heads = [z[:, h] @ a.o_proj.weight[:, h * DH:(h + 1) * DH].T for h in range(H)]
        attn_out = sum(heads)
        if gemma:
            attn_out = b.post_attention_layernorm(attn_out)
        for h in range(H):
            record(f"L{layer}.H{h}", heads[h][0])
        x = x + attn_out
        m = b.mlp((b.pre_feedforward_layernorm if gemma else b.post_attention_layernorm)(reader(f"L{layer}.MLP", x)))
        if gemma:
            m = b.post_feedforward_layernorm(m)
        record(f"L{layer}.MLP", m[0])
        x = x + m
    logits = net.lm_head(t.norm(reader("logits", x)))[0]
    if gemma and cfg.final_logit_softcapping:
        logits = torch.tanh(logits / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
    return logits


def metric(logits, it):
    return logits[-1, it["answer"]] - logits[-1, it["wrong"]]


def acts(net, ids):
    out = {}
    with torch.no_grad():
        forward(net, ids, record=out.__setitem__)
    return out


def reference_edges(net, items, m=1):
    """EAP (m = 1) or EAP-IG: the gradients averaged over m runs whose token embedding is
    e_corrupt + (k / m)(e_clean - e_corrupt), k = 0..m-1."""
    writers, readers = graph_labels(L, H)
    total = np.zeros((len(writers), len(readers)))
    for it in items:
        clean, corrupt = acts(net, it["input_ids"]), acts(net, it["corrupt"])
        grads = {}
        for step in range(m):
            leaves = {}

            def leaf(name, x):
                leaves[name] = torch.zeros_like(x, requires_grad=True)
                return x + leaves[name]

            e = (corrupt["embed"] + step / m * (clean["embed"] - corrupt["embed"]))[None]
            value = metric(forward(net, it["corrupt"], reader=leaf, embed=e), it)
            for name, g in zip(leaves, torch.autograd.grad(value, list(leaves.values())), strict=True):
                grads[name] = grads.get(name, 0) + g / m
        for i, w in enumerate(writers):
            for j, r in enumerate(readers):
                if feeds(w, r):
                    total[i, j] += float(((clean[w] - corrupt[w]).double() * grads[r][0].double()).sum())
    mask = np.array([[feeds(w, r) for r in readers] for w in writers])
    return np.where(mask, total / len(items), np.nan)


def reference_recovered(net, items, kept):
    """Every edge outside `kept` ablated: each reader's input minus (live - corrupted) of its ablated writers;
    on Gemma 2 an ablated head's layer goes in as the post-attention norm of its heads with the reader's ablated
    ones corrupted, in place of the norm of the live heads (EAP-IG's evaluate_graph)."""
    writers, _ = graph_labels(L, H)
    values, clean_m, corrupt_m = [], [], []
    gemma = net.config.model_type == "gemma2"
    for it in items:
        corrupt = acts(net, it["corrupt"])
        live = {}

        def rebuild(name, x):
            out = x[0]
            swapped = {}
            for w in writers:
                if feeds(w, name) and (w, name) not in kept:
                    if gemma and ".H" in w:
                        layer = int(w[1:].split(".")[0])
                        swapped[layer] = swapped.get(layer, 0) + (corrupt[w] - live[w])
                    else:
                        out = out - (live[w] - corrupt[w])
            for layer, s in swapped.items():
                norm = net.model.layers[layer].post_attention_layernorm
                heads = sum(live[f"L{layer}.H{h}"] for h in range(H))
                out = out + norm(heads + s) - norm(heads)
            return out[None]

        with torch.no_grad():
            values.append(float(metric(forward(net, it["input_ids"], reader=rebuild, record=live.__setitem__), it)))
            clean_m.append(float(metric(net(it["input_ids"][None]).logits[0], it)))
            corrupt_m.append(float(metric(net(it["corrupt"][None]).logits[0], it)))
    return (np.mean(values) - np.mean(corrupt_m)) / (np.mean(clean_m) - np.mean(corrupt_m))


MODELS = [("gemma2", H, 1), ("gemma2", 2, 2), ("llama", 2, 1), ("qwen2", 2, 2), ("mistral", 1, 1)]


@pytest.mark.parametrize("kind, kv, m", MODELS)
def test_edges_and_faithfulness_equal_raw_torch(kind, kv, m, items):
    """The grid (names, NaN pattern, values) equals the raw-torch EAP (m = 1) or EAP-IG; faithfulness at k = 6
    and 60 equals the reference ablation of the same circuits; the written-out forward is checked against the
    model's own."""
    net = build(kind, kv)
    for it in items[:1]:
        with torch.no_grad():
            torch.testing.assert_close(forward(net, it["input_ids"]), net(it["input_ids"][None]).logits[0], atol=1e-4, rtol=1e-4)
    method = {"method": "eap"} if m == 1 else {"method": "eap_ig", "ig_steps": m}
    got = hookrun.patch_grid(net, items, clean="input_ids", faithfulness={"edges": [6, 60]}, **method)["edges"]
    writers, readers = graph_labels(L, H)
    assert list(got.writer.values) == writers and list(got.reader.values) == readers
    want = reference_edges(net, items, m)
    np.testing.assert_array_equal(np.isnan(got.values), np.isnan(want))
    scale = np.nanmax(np.abs(want))
    assert scale > 0.1, "the model is too flat for the comparison to mean anything"
    np.testing.assert_allclose(got.values, want, atol=1e-5 * scale, rtol=1e-4)
    order = np.argsort(-np.where(np.isnan(got.values), -1.0, np.abs(got.values)).reshape(-1), kind="stable")
    for k, rec in zip([6, 60], got.attrs["faithfulness_recovered"], strict=True):
        kept = {(writers[i // len(readers)], readers[i % len(readers)]) for i in order[:k]}
        assert rec == pytest.approx(reference_recovered(net, items, kept), abs=1e-4), (kind, k)


@pytest.mark.parametrize("kind, kv", [("gemma2", 2), ("llama", 2)])
def test_writers_of_a_block_sum_to_the_residual_increment(kind, kv, items):
    """The graph's writers, read with plain hooks on the decoder layers: a layer's heads sum to what the residual
    gains from its attention (on Gemma 2: to the post-attention norm's input, whose norm is that gain), its MLP
    writer to what it gains from the MLP."""
    net = build(kind, kv)
    _, wiring = find_graph(net)
    resid = {}
    handles = []
    for layer, b in enumerate(net.model.layers):
        mid = b.pre_feedforward_layernorm if kind == "gemma2" else b.post_attention_layernorm
        handles += [b.register_forward_pre_hook(lambda m, a, k, layer=layer: resid.__setitem__(("pre", layer), (a or (k["hidden_states"],))[0]), with_kwargs=True),
                    mid.register_forward_pre_hook(lambda m, a, layer=layer: resid.__setitem__(("mid", layer), a[0])),
                    b.register_forward_hook(lambda m, a, o, layer=layer: resid.__setitem__(("post", layer), o[0] if isinstance(o, tuple) else o))]
        if kind == "gemma2":
            handles.append(b.post_attention_layernorm.register_forward_pre_hook(
                lambda m, a, layer=layer: resid.__setitem__(("attn", layer), a[0])))
    got = {}
    try:
        with torch.no_grad(), wiring.tap(writer=lambda g, a: got.__setitem__(g, a)):
            net(items[0]["input_ids"][None])
    finally:
        for h in handles:
            h.remove()
    torch.testing.assert_close(got[("embed",)][:, :, 0], resid[("pre", 0)])
    for layer in range(L):
        assert got[("attn", layer)].shape[2] == H
        heads = got[("attn", layer)].sum(2)
        if kind == "gemma2":
            torch.testing.assert_close(heads, resid[("attn", layer)], atol=1e-5, rtol=1e-4)
            norm, bias = wiring.post_norms[("attn", layer)]
            assert norm is net.model.layers[layer].post_attention_layernorm and bias is None
            heads = norm(heads)
        torch.testing.assert_close(heads, resid[("mid", layer)] - resid[("pre", layer)], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got[("mlp", layer)][:, :, 0], resid[("post", layer)] - resid[("mid", layer)], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kv", [2, 1])
def test_hooked_transformer_gqa_is_ungrouped(kv, items):
    """A HookedTransformer with n_key_value_heads: one k and v reader per query head; the k (v) readers of a
    group's query heads sum to the grouped model's own key (value) input of that group (TransformerLens' grouped
    hook_k_input, split q/k/v inputs, no ungrouping), q / MLP / logits readers equal it directly."""
    from tl_models import hooked_transformer

    model = hooked_transformer(V, n_layers=L, d_model=16, n_ctx=8, d_head=4, n_heads=H, n_key_value_heads=kv, act_fn="gelu")
    tl_items = [{"clean": it["input_ids"], **{k: it[k] for k in ("corrupt", "answer", "wrong")}} for it in items]
    got = hookrun.patch_grid(model, tl_items, input="input", method="eap")["edges"]
    writers, readers = graph_labels(L, H)
    assert list(got.writer.values) == writers and list(got.reader.values) == readers
    assert not model.cfg.ungroup_grouped_query_attention  # restored after the run
    model.set_use_split_qkv_input(True)
    model.set_use_attn_result(True)
    model.set_use_hook_mlp_in(True)
    want = {}
    for it in tl_items:
        _, clean = model.run_with_cache(it["clean"][None])
        _, corrupt = model.run_with_cache(it["corrupt"][None])
        names = [f"blocks.{layer}.hook_{k}_input" for layer in range(L) for k in "qkv"]
        names += [f"blocks.{layer}.hook_mlp_in" for layer in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
        grads = {}
        logits = model.run_with_hooks(it["corrupt"][None], bwd_hooks=[(n, lambda g, hook: grads.__setitem__(hook.name, g[0].detach())) for n in names])
        metric(logits[0], it).backward()
        model.zero_grad()
        w_acts = {"embed": clean["hook_embed"][0] - corrupt["hook_embed"][0]}
        for layer in range(L):
            diff = clean[f"blocks.{layer}.attn.hook_result"][0] - corrupt[f"blocks.{layer}.attn.hook_result"][0]
            w_acts.update({f"L{layer}.H{h}": diff[:, h] for h in range(H)})
            w_acts[f"L{layer}.MLP"] = clean[f"blocks.{layer}.hook_mlp_out"][0] - corrupt[f"blocks.{layer}.hook_mlp_out"][0]
        for w, a in w_acts.items():
            for layer in range(L):
                for kind in "qkv":
                    g = grads[f"blocks.{layer}.hook_{kind}_input"]  # [T, heads or groups, d]
                    for j in range(g.shape[1]):
                        key = (w, f"L{layer}.{kind}{j}")
                        if feeds(w, f"L{layer}.H0.q"):
                            want[key] = want.get(key, 0.0) + float((a.double() * g[:, j].double()).sum()) / len(tl_items)
                if feeds(w, f"L{layer}.MLP"):
                    key = (w, f"L{layer}.MLP")
                    want[key] = want.get(key, 0.0) + float((a.double() * grads[f"blocks.{layer}.hook_mlp_in"].double()).sum()) / len(tl_items)
            key = (w, "logits")
            want[key] = want.get(key, 0.0) + float((a.double() * grads[f"blocks.{L - 1}.hook_resid_post"].double()).sum()) / len(tl_items)
    grid = got.to_pandas()
    for (w, r), value in want.items():
        if r in ("logits",) or r.endswith(".MLP"):
            mine = grid.loc[w, r]
        else:
            layer, kind, j = r.split(".")[0], r.split(".")[1][0], int(r.split(".")[1][1:])
            heads = [j] if kind == "q" else range(j * (H // kv), (j + 1) * (H // kv))  # a query head; a group's heads
            mine = sum(grid.loc[w, f"{layer}.H{h}.{kind}"] for h in heads)
        assert mine == pytest.approx(value, abs=1e-5, rel=1e-4), (w, r)


def test_an_unknown_attention_is_refused_in_one_line(items):
    """Before any forward: a model type the graph does not know (its norms could sit anywhere), naming it and what
    the graph knows; a known type whose layer has a module the graph does not know, naming that module."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    net = Qwen3ForCausalLM(Qwen3Config(vocab_size=V, hidden_size=D, num_hidden_layers=1, num_attention_heads=H,
                                       num_key_value_heads=2, head_dim=DH, intermediate_size=64)).eval()
    calls = []
    net.register_forward_pre_hook(lambda m, a: calls.append(1))
    with pytest.raises(ConfigError, match=r"Qwen3ForCausalLM \(model_type 'qwen3'\): the residual graph does not know "
                                          r"its attention and norms \(its self_attn has k_norm, q_norm"):
        hookrun.patch_grid(net, items, clean="input_ids", method="eap")
    llama = build("llama", 2)
    llama.model.layers[0].add_module("post_feedforward_layernorm", torch.nn.Identity())
    with pytest.raises(ConfigError, match=r"does not know this decoder layer: it has post_feedforward_layernorm"):
        hookrun.patch_grid(llama, items, clean="input_ids", method="eap")
    assert not calls
    from tl_models import hooked_transformer

    sandwich = hooked_transformer(V, n_layers=1, d_model=16, n_ctx=8, d_head=4, n_heads=H, normalization_type="RMS",
                                  use_normalization_before_and_after=True)
    tl_items = [{"clean": it["input_ids"], **{k: it[k] for k in ("corrupt", "answer", "wrong")}} for it in items]
    with pytest.raises(ConfigError, match=r"norms each attention and MLP output .*use_normalization_before_and_after"):
        hookrun.patch_grid(sandwich, tl_items, input="input", method="eap")


@pytest.mark.parametrize("kind, kv", [("gemma2", 2), ("mistral", 1)])
def test_exact_head_grid_equals_raw_hooks(kind, kv, items):
    """Exact patching over heads on HF attention: the op site `self_attn/contiguous.0` (eager attention's per-head
    output [batch, position, head, d_head], the query heads) against a plain pre-hook on o_proj that puts one head's
    clean slice at one position into the corrupted run."""
    net = build(kind, kv)
    site = {"at": "model.layers.*.self_attn/contiguous.0", "over": ["position", "head"],
            "dims": ["sample", "position", "head", "feature"]}
    got = hookrun.patch_grid(net, items, clean="input_ids", method="exact", sites={"heads": site})["heads"]
    assert got.shape == (L, T, H)
    clean_ids = torch.stack([it["input_ids"] for it in items])
    corrupt_ids = torch.stack([it["corrupt"] for it in items])
    answer, wrong = torch.tensor([it["answer"] for it in items]), torch.tensor([it["wrong"] for it in items])
    z = {}
    projs = [b.self_attn.o_proj for b in net.model.layers]
    handles = [p.register_forward_pre_hook(lambda m, a, layer=layer: z.__setitem__(layer, a[0].clone())) for layer, p in enumerate(projs)]
    with torch.no_grad():
        net(clean_ids)
    for h in handles:
        h.remove()
    want = np.zeros((L, T, H))
    for layer in range(L):
        for pos in range(T):
            for head in range(H):
                def put(m, a, layer=layer, pos=pos, head=head):
                    x = a[0].clone()
                    x[:, pos, head * DH:(head + 1) * DH] = z[layer][:, pos, head * DH:(head + 1) * DH]
                    return (x,)
                handle = projs[layer].register_forward_pre_hook(put)
                with torch.no_grad():
                    logits = net(corrupt_ids).logits[:, -1]
                handle.remove()
                want[layer, pos, head] = float((logits[torch.arange(len(items)), answer] - logits[torch.arange(len(items)), wrong]).mean())
    np.testing.assert_allclose(got.values, want, atol=1e-5, rtol=1e-4)
    assert np.ptp(want) > 0.1
