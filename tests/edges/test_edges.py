"""Edge attribution (EAP, EAP-IG), atp_ig and faithfulness against raw-torch computations of their
definitions on a TransformerLens 3.9 HookedTransformer with split q/k/v inputs (docs/edges.md).

The references loop over items one at a time (as TransformerLens 4.3 does), read gradients with
TransformerLens' own backward hooks at hook_q_input / k / v, hook_mlp_in and the last hook_resid_post,
interpolate hook_embed (the token embedding), and enumerate edges by explicit layer rules.
"""

# ruff: noqa: B023  (the reference hooks are closures used within the loop iteration that defines them)
from __future__ import annotations

import numpy as np
import pytest
import torch
from edge_graph import feeds, graph_labels, prompt_pairs
from tl_models import hooked_transformer

import hookrun
from hookrun.errors import ConfigError

V, L, H, T = 40, 2, 4, 6


@pytest.fixture(scope="module")
def model():
    return hooked_transformer(V, n_layers=L, d_model=16, n_ctx=8, d_head=4, n_heads=H, act_fn="gelu")


@pytest.fixture(scope="module")
def items():
    return prompt_pairs(V, T, seed=1, at=2, shift=7)


def metric(logits, it):
    return logits[0, -1, it["answer"]] - logits[0, -1, it["wrong"]]


def writer_acts(model, ids):
    """{label: [T, d]} of one item, from run_with_cache."""
    model.set_use_attn_result(True)
    _, cache = model.run_with_cache(ids[None])
    out = {"embed": cache["hook_embed"][0]}
    for layer in range(L):
        for h in range(H):
            out[f"L{layer}.H{h}"] = cache[f"blocks.{layer}.attn.hook_result"][0, :, h]
        out[f"L{layer}.MLP"] = cache[f"blocks.{layer}.hook_mlp_out"][0]
    return out


def reader_grads(model, ids, it, embed_clean=None, embed_corrupt=None, alpha=0.0):
    """{label: [T, d]}: d metric / d reader input on one item, hook_embed interpolated by alpha."""
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    grads = {}

    def keep(name):
        def hook(g, hook):
            grads[name] = g[0].detach().clone()
        return hook

    names = [f"blocks.{layer}.hook_{k}_input" for layer in range(L) for k in "qkv"]
    names += [f"blocks.{layer}.hook_mlp_in" for layer in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    fwd = []
    if embed_clean is not None:
        fwd.append(("hook_embed", lambda x, hook: (embed_corrupt + alpha * (embed_clean - embed_corrupt))[None]))
    logits = model.run_with_hooks(ids[None], fwd_hooks=fwd, bwd_hooks=[(n, keep(n)) for n in names])
    model.zero_grad()
    metric(logits, it).backward()
    model.zero_grad()
    out = {"logits": grads[f"blocks.{L - 1}.hook_resid_post"]}
    for layer in range(L):
        for k in "qkv":
            for h in range(H):
                out[f"L{layer}.H{h}.{k}"] = grads[f"blocks.{layer}.hook_{k}_input"][:, h]
        out[f"L{layer}.MLP"] = grads[f"blocks.{layer}.hook_mlp_in"]
    return out


def reference_edges(model, items, m):
    writers, readers = graph_labels(L, H)
    total = np.zeros((len(writers), len(readers)))
    by_position = np.zeros((len(writers), T))
    for it in items:
        clean, corrupt = writer_acts(model, it["clean"]), writer_acts(model, it["corrupt"])
        grads = None
        for step in range(m):
            g = reader_grads(model, it["corrupt"], it, clean["embed"], corrupt["embed"], step / m)
            grads = g if grads is None else {k: grads[k] + g[k] for k in g}
        for i, w in enumerate(writers):
            for j, r in enumerate(readers):
                if feeds(w, r):
                    terms = (clean[w] - corrupt[w]).double() * grads[r].double() / m
                    total[i, j] += float(terms.sum())
                    by_position[i] += terms.sum(-1).numpy()
    out = total / len(items)
    mask = np.array([[feeds(w, r) for r in readers] for w in writers])
    return np.where(mask, out, np.nan), by_position / len(items)


@pytest.mark.parametrize("method, m", [("eap", 1), ("eap_ig", 3)])
def test_edges_equal_raw_torch(model, items, method, m):
    got = hookrun.patch_grid(model, items, input="input", method=method, **({"ig_steps": m} if m > 1 else {}))["edges"]
    writers, readers = graph_labels(L, H)
    assert list(got.writer.values) == writers and list(got.reader.values) == readers
    want, by_position = reference_edges(model, items, m)
    np.testing.assert_allclose(got.attrs["node_scores_by_position"], by_position, atol=1e-5, rtol=1e-4)
    np.testing.assert_array_equal(np.isnan(got.values), np.isnan(want))
    np.testing.assert_allclose(got.values, want, atol=1e-5, rtol=1e-4)
    assert np.isfinite(got.values).sum() == 11 * 27 - (L * (L - 1) // 2) * 0 - _upstream_missing()
    np.testing.assert_allclose(got.attrs["node_scores"], np.nansum(want, axis=1), atol=1e-5)


def _upstream_missing():
    writers, readers = graph_labels(L, H)
    return sum(not feeds(w, r) for w in writers for r in readers)


def reference_faithfulness(model, items, kept, ablation):
    """Mean over items of the metric with every edge outside `kept` ablated, rebuilt reader by reader."""
    writers, readers = graph_labels(L, H)
    values = []
    mean = None
    if ablation == "mean":
        acts = [writer_acts(model, it["corrupt"]) for it in items]
        mean = {w: sum(a[w] for a in acts) / len(acts) for w in writers}
    for it in items:
        repl = writer_acts(model, it["corrupt"]) if mean is None else mean
        live = {}

        def cap(label, head=None):
            def hook(x, hook):
                live[label] = x[0] if head is None else None
                if head == "all":
                    for h in range(H):
                        live[label.format(h=h)] = x[0, :, h]
            return hook

        def rebuild(read, head=None):
            def hook(x, hook):
                x = x.clone()
                for w in writers:
                    for h in (range(H) if head else [None]):
                        r = read.format(h=h) if head else read
                        if feeds(w, r) and (w, r) not in kept:
                            if h is None:
                                x[0] = x[0] - (live[w] - repl[w])
                            else:
                                x[0, :, h] = x[0, :, h] - (live[w] - repl[w])
                return x
            return hook

        fwd = [("hook_embed", cap("embed"))]
        for layer in range(L):
            for k in "qkv":
                fwd.append((f"blocks.{layer}.hook_{k}_input", rebuild(f"L{layer}.H{{h}}.{k}", head=True)))
            fwd.append((f"blocks.{layer}.attn.hook_result", cap(f"L{layer}.H{{h}}", head="all")))
            fwd.append((f"blocks.{layer}.hook_mlp_in", rebuild(f"L{layer}.MLP")))
            fwd.append((f"blocks.{layer}.hook_mlp_out", cap(f"L{layer}.MLP")))
        fwd.append((f"blocks.{L - 1}.hook_resid_post", rebuild("logits")))
        model.set_use_split_qkv_input(True)
        model.set_use_hook_mlp_in(True)
        model.set_use_attn_result(True)
        with torch.no_grad():
            values.append(float(metric(model.run_with_hooks(it["clean"][None], fwd_hooks=fwd), it)))
    return float(np.mean(values))


@pytest.mark.parametrize("ablation", ["corrupt", "mean"])
def test_faithfulness_equals_raw_torch(model, items, ablation):
    ks = [0, 7, 60, 110]
    got = hookrun.patch_grid(model, items, input="input", method="eap",
                             faithfulness={"edges": ks, "ablation": ablation})["edges"]
    writers, readers = graph_labels(L, H)
    scores = np.nan_to_num(got.values, nan=-1.0)
    flat = np.where(np.isnan(got.values), -1.0, np.abs(got.values)).reshape(-1)
    order = np.argsort(-flat, kind="stable")
    with torch.no_grad():
        clean = np.mean([float(metric(model(it["clean"][None]), it)) for it in items])
        corrupt = np.mean([float(metric(model(it["corrupt"][None]), it)) for it in items])
    for k, rec in zip(ks, got.attrs["faithfulness_recovered"], strict=True):
        kept = {(writers[i // len(readers)], readers[i % len(readers)]) for i in order[:k]}
        want = (reference_faithfulness(model, items, kept, ablation) - corrupt) / (clean - corrupt)
        assert rec == pytest.approx(want, abs=1e-4), (k, rec, want)
    del scores


def test_atp_ig_equals_raw_torch(model, items):
    m = 4
    got = hookrun.patch_grid(model, items, input="input", method="atp_ig", ig_steps=m,
                             sites={"resid": {"at": "blocks.*.hook_resid_pre", "over": ["position"]}})["resid"]
    want = np.zeros((L, T))
    base = 0.0
    for it in items:
        model.reset_hooks()
        with torch.no_grad():
            _, cc = model.run_with_cache(it["clean"][None])
            _, kc = model.run_with_cache(it["corrupt"][None])
            base += float(metric(model(it["corrupt"][None]), it)) / len(items)
        for step in range(m):
            acts = {}

            def keep(x, hook):
                x.retain_grad()
                acts[hook.name] = x
            e = kc["hook_embed"] + step / m * (cc["hook_embed"] - kc["hook_embed"])
            fwd = [("hook_embed", lambda x, hook: e)] + [(f"blocks.{layer}.hook_resid_pre", keep) for layer in range(L)]
            with torch.enable_grad():
                logits = model.run_with_hooks(it["corrupt"][None], fwd_hooks=fwd)
                metric(logits, it).backward()
            for layer in range(L):
                name = f"blocks.{layer}.hook_resid_pre"
                want[layer] += ((cc[name] - kc[name]) * acts[name].grad)[0].sum(-1).numpy() / m / len(items)
            model.zero_grad()
    np.testing.assert_allclose(got.values, want + base, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("block, message", [
    ({"method": "eap_ig", "ig_steps": 0}, "patching.ig_steps=0"),
    ({"method": "eap", "faithfulness": {"edges": [10, 100000]}}, "100000 is more than the model's"),
    ({"method": "eap", "graph": "mine"}, "patching.graph='mine'; choose from: auto"),
])
def test_bad_edge_blocks_one_line(model, items, block, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")) as err:
        hookrun.patch_grid(model, items, input="input", **block)
    assert "\n" not in str(err.value)


def test_clean_equal_to_corrupt_refused(model, items):
    same = [{**it, "corrupt": it["clean"]} for it in items]
    with pytest.raises(ConfigError, match="recovered fraction"):
        hookrun.patch_grid(model, same, input="input", method="eap", faithfulness={"edges": [5]})


def test_no_graph_refused_in_one_line(items):
    net = torch.nn.Sequential(torch.nn.Embedding(V, 8), torch.nn.Linear(8, V))
    with pytest.raises(ConfigError, match=r"^patching.graph=auto: no residual graph found for Sequential"):
        hookrun.patch_grid(net, items, input="input", method="eap")
    calls = []
    net.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(ConfigError, match=r"^patching.method=atp_ig: no residual graph found for Sequential"):
        hookrun.patch_grid(net, items, input="input", method="atp_ig", sites={"emb": {"at": "0", "over": ["position"]}})
    assert not calls  # refused before any forward


def test_sites_with_an_edge_method_refused(model, items):
    with pytest.raises(ConfigError, match="patching.sites: method eap scores the edges"):
        hookrun.patch_grid(model, items, input="input", method="eap", sites={"r": "blocks.*.hook_resid_pre"})


def _hf_models():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=64, max_position_embeddings=16, use_parallel_residual=True))
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=4, intermediate_size=64, max_position_embeddings=16))
    return {"neox": (neox.eval(), 110 - L * H), "llama": (llama.eval(), 110)}


def test_neox_and_llama_graphs_rebuild_the_clean_and_corrupted_runs(items):
    """No edge kept: the corrupted run's metric (recovered 0); every edge kept: the clean run's (1), the model's
    own forwards being the reference; a parallel block's MLP reads no head of its own layer."""
    hf_items = [{"input_ids": it["clean"], **{k: it[k] for k in ("corrupt", "answer", "wrong")}} for it in items]
    for name, (net, edges) in _hf_models().items():
        got = hookrun.patch_grid(net, hf_items, clean="input_ids", method="eap", faithfulness={"edges": [0, edges]})["edges"]
        assert int(np.isfinite(got.values).sum()) == edges, name
        np.testing.assert_allclose(got.attrs["faithfulness_recovered"], [0.0, 1.0], atol=1e-5, err_msg=name)


def test_faithfulness_ranked_by_an_earlier_runs_file(model, items, tmp_path):
    """faithfulness.from: PATH ranks the edges by that file's grid: an eap file run, then an eap_ig run whose
    circuits come from it, equal to the eap run's own curve (the same circuits, the same exact forwards)."""
    path = tmp_path / "eap.h5"
    hookrun.run({"data": {"inputs": {"input": "clean"}, "target": None}, "progress": False, "output": {"path": str(path), "overwrite": True},
                 "patching": {"input": "input", "method": "eap", "faithfulness": {"edges": [3, 30]}}},
                model=model, dataset=items)
    own = hookrun.open_run(path).edges()[1].attrs["faithfulness_recovered"]
    got = hookrun.patch_grid(model, items, input="input", method="eap_ig", ig_steps=2,
                             faithfulness={"edges": [3, 30], "from": str(path)})["edges"]
    np.testing.assert_allclose(got.attrs["faithfulness_recovered"], own, atol=1e-6)
    with pytest.raises(ConfigError, match="patching.faithfulness.from="):
        hookrun.patch_grid(model, items, input="input", method="eap", faithfulness={"edges": [3], "from": str(tmp_path / "no.h5")})


@pytest.fixture(scope="module")
def gpt2_pair():
    """An HF GPT-2 and a HookedTransformer with its weights (TransformerLens 3.9's convert_gpt2_weights)."""
    import warnings

    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=L, n_head=H)).eval()
    cfg = HookedTransformerConfig(n_layers=L, d_model=16, d_head=4, n_heads=H, d_mlp=64, d_vocab=V, n_ctx=16,
                                  act_fn="gelu_new", normalization_type="LN", eps=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ht = HookedTransformer(cfg)
    ht.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    return hf, ht.eval()


def test_hf_gpt2_edges_and_faithfulness_equal_raw_torch(gpt2_pair, items):
    """The HF GPT-2 graph (per-head q/k/v inputs recomputed through ln_1, per-head outputs from c_proj's input)
    against the raw-torch references on the HookedTransformer with the same weights."""
    hf, ht = gpt2_pair
    hf_items = [{"input_ids": it["clean"], **{k: it[k] for k in ("corrupt", "answer", "wrong")}} for it in items]
    for method, m in (("eap", 1), ("eap_ig", 2)):
        got = hookrun.patch_grid(hf, hf_items, clean="input_ids", method=method, ig_steps=m if m > 1 else None,
                                 faithfulness={"edges": [4, 40]})["edges"]
        want, _ = reference_edges(ht, items, m)
        np.testing.assert_allclose(got.values, want, atol=1e-5, rtol=1e-4, err_msg=method)
    writers, readers = graph_labels(L, H)
    order = np.argsort(-np.where(np.isnan(got.values), -1.0, np.abs(got.values)).reshape(-1), kind="stable")
    with torch.no_grad():
        clean = np.mean([float(metric(ht(it["clean"][None]), it)) for it in items])
        corrupt = np.mean([float(metric(ht(it["corrupt"][None]), it)) for it in items])
    for k, rec in zip([4, 40], got.attrs["faithfulness_recovered"], strict=True):
        kept = {(writers[i // len(readers)], readers[i % len(readers)]) for i in order[:k]}
        assert rec == pytest.approx((reference_faithfulness(ht, items, kept, "corrupt") - corrupt) / (clean - corrupt), abs=1e-4)


def test_an_interrupted_edges_run_resumes_to_the_same_scores(model, items, tmp_path, sigint_default):
    """An edges run scores every edge before its file opens: a SIGINT meanwhile (here at the metric's
    third call, inside the integrated-gradients pass) leaves no file and says so, and resume=true then
    writes the scores and the faithfulness curve of an uninterrupted run."""
    import patch_metrics

    from hookrun.output.process import Interrupted

    def cfg(path, **more):
        return {"data": {"inputs": {"input": "clean"}, "target": None}, "progress": False, "output": {"path": str(path)},
                "patching": {"input": "input", "method": "eap_ig", "ig_steps": 2, "metric": {"_target_": "patch_metrics.last_logit"},
                             "faithfulness": {"edges": [3, 30]}}, **more}

    hookrun.run(cfg(tmp_path / "straight.h5"), model=model, dataset=items)
    patch_metrics.CALLS[0], patch_metrics.SIGNAL_AT[:] = 0, [3]
    with pytest.raises(Interrupted, match="before the output file was created; nothing was written"):
        hookrun.run(cfg(tmp_path / "cut.h5"), model=model, dataset=items)
    assert not (tmp_path / "cut.h5").exists()
    assert hookrun.run(cfg(tmp_path / "cut.h5", resume=True), model=model, dataset=items).status == "complete"
    want, got = (hookrun.open_run(tmp_path / name).edges()[1] for name in ("straight.h5", "cut.h5"))
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(got.attrs["faithfulness_recovered"], want.attrs["faithfulness_recovered"])
