"""Patching grids (issue 32): exact grids equal TransformerLens 3.9's patching functions on the same
HookedTransformer; the packed grid equals a one-cell-at-a-time loop of raw forward hooks; atp equals
the estimate computed with torch.autograd.grad, on module sites and on a spliced SAE's latents."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import hookrun

tl = pytest.importorskip("transformer_lens")
safetensors = pytest.importorskip("safetensors.torch")
from patch_tasks import token_task  # noqa: E402
from tl_models import hooked_transformer  # noqa: E402
from toy_lm import tiny_gpt2  # noqa: E402
from transformer_lens import patching  # noqa: E402

N, T, V = 3, 6, 50
HEADS = {"at": "blocks.*.attn.hook_z", "over": ["position", "head"], "dims": ["sample", "position", "head", "feature"]}
HEADS_ALL = {"at": "blocks.*.attn.hook_z", "over": ["head"], "dims": ["sample", "position", "head", "feature"]}
RESID = {"at": "blocks.*.hook_resid_pre", "over": ["position"]}


@pytest.fixture(scope="module")
def model():
    return hooked_transformer(V, d_model=32, n_ctx=16, d_head=8, act_fn="gelu")


@pytest.fixture(scope="module")
def task():
    return token_task(V, N, T, at=2)


def tl_metric(ans, wrong):
    r = torch.arange(len(ans))
    return lambda logits: (logits[r, -1, ans] - logits[r, -1, wrong]).mean()


def grids(model, items, **block):
    return hookrun.patch_grid(model, items, input="input", **block)


def test_the_three_grids_equal_transformer_lens(model, task):
    clean, corrupt, ans, wrong, items = task
    _, cache = model.run_with_cache(clean)
    metric = tl_metric(ans, wrong)
    g = grids(model, items, sites={"resid": RESID, "heads": HEADS, "heads_all": HEADS_ALL})
    for name, fn in (("resid", patching.get_act_patch_resid_pre), ("heads", patching.get_act_patch_attn_head_out_by_pos),
                     ("heads_all", patching.get_act_patch_attn_head_out_all_pos)):
        ref = fn(model, corrupt, cache, metric).numpy()
        assert g[name].shape == ref.shape
        np.testing.assert_allclose(g[name].values, ref, atol=1e-4)
    assert g["heads"].dims == ("module", "position", "head")
    assert list(g["heads"].module.values) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]


def test_noise_direction_patches_the_corrupted_run_into_the_clean_one(model, task):
    clean, corrupt, ans, wrong, items = task
    _, cache = model.run_with_cache(corrupt)
    ref = patching.get_act_patch_resid_pre(model, clean, cache, tl_metric(ans, wrong)).numpy()
    g = grids(model, items, direction="noise", sites={"resid": RESID})
    np.testing.assert_allclose(g["resid"].values, ref, atol=1e-4)


def test_normalize_uses_the_clean_and_corrupted_means(model, task):
    clean, corrupt, ans, wrong, items = task
    metric = tl_metric(ans, wrong)
    with torch.no_grad():
        m_clean, m_corrupt = float(metric(model(clean))), float(metric(model(corrupt)))
    raw = grids(model, items, sites={"resid": RESID})["resid"]
    norm = grids(model, items, metric={"name": "logit_diff", "normalize": True}, sites={"resid": RESID})["resid"]
    np.testing.assert_allclose(norm.values, (raw.values - m_corrupt) / (m_clean - m_corrupt), atol=1e-5)
    assert norm.attrs["metric_clean"] == pytest.approx(m_clean, abs=1e-5)


def test_packed_grid_equals_a_one_cell_loop_of_raw_hooks_on_gpt2():
    m = tiny_gpt2(n_layer=3, n_embd=32, n_head=4, vocab_size=V, n_positions=16)
    g = torch.Generator().manual_seed(2)
    clean = torch.randint(0, V, (4, 5), generator=g)
    corrupt = torch.randint(0, V, (4, 5), generator=g)
    ans = torch.randint(0, V, (4,), generator=g)
    items = [{"clean": clean[i], "corrupt": corrupt[i], "answer": ans[i]} for i in range(4)]
    packed = hookrun.patch_grid(m, items, metric={"name": "logprob"}, cells_per_forward=7,
                                sites={"mlp": {"at": "transformer.h.*.mlp", "over": ["position"]}})["mlp"].values
    with torch.no_grad():  # the reference: one forward per cell, a raw hook returning the patched output
        keep = {}
        hs = [m.transformer.h[i].mlp.register_forward_hook(lambda mod, a, o, i=i: keep.__setitem__(i, o)) for i in range(3)]
        m(clean)
        for h in hs:
            h.remove()
        ref = np.zeros((3, 5))
        for layer in range(3):
            for pos in range(5):
                def patch(mod, a, o, layer=layer, pos=pos):
                    o = o.clone()
                    o[:, pos] = keep[layer][:, pos]
                    return o
                h = m.transformer.h[layer].mlp.register_forward_hook(patch)
                lp = torch.log_softmax(m(corrupt).logits[:, -1], -1)[torch.arange(4), ans]
                h.remove()
                ref[layer, pos] = lp.double().mean()
    np.testing.assert_allclose(packed, ref, atol=1e-5)


def raw_atp(model, clean, corrupt, metric, hook_name, hook_of=None):
    """metric(corrupt) + sum over each (layer, pos) of (clean - corrupt) * d metric / d act, with raw hooks."""
    _, clean_cache = model.run_with_cache(clean)
    _, corrupt_cache = model.run_with_cache(corrupt)
    deltas = {}

    def add(act, hook):
        d = torch.zeros_like(act, requires_grad=True)
        deltas[hook.name] = d
        return act + d

    with torch.enable_grad():
        m = metric(model.run_with_hooks(corrupt, fwd_hooks=[(lambda n: n.endswith(hook_name), add)]))
    names = sorted(deltas)
    grads = torch.autograd.grad(m, [deltas[n] for n in names])
    return float(m.detach()), {n: (clean_cache[n] - corrupt_cache[n]) * gr for n, gr in zip(names, grads, strict=True)}


def test_atp_equals_the_autograd_estimate_on_module_sites(model, task):
    clean, corrupt, ans, wrong, items = task
    m0, terms = raw_atp(model, clean, corrupt, tl_metric(ans, wrong), "attn.hook_z")
    ref = np.stack([(m0 + terms[f"blocks.{layer}.attn.hook_z"].sum(dim=(0, 3))).detach().numpy() for layer in range(2)])
    g = grids(model, items, method="atp", sites={"heads": HEADS})["heads"]
    assert g.attrs["method"] == "atp"
    np.testing.assert_allclose(g.values, ref, atol=1e-4)


def test_atp_verify_recomputes_the_largest_cells_exactly(model, task):
    clean, corrupt, ans, wrong, items = task
    _, cache = model.run_with_cache(clean)
    exact = patching.get_act_patch_attn_head_out_by_pos(model, corrupt, cache, tl_metric(ans, wrong)).numpy()
    out = grids(model, items, method="atp", verify=5, which="exact", sites={"heads": HEADS})["heads"].values
    done = ~np.isnan(out)
    assert done.sum() == 5
    np.testing.assert_allclose(out[done], exact[done], atol=1e-4)
    # the 5 of largest estimated effect |estimate - metric_corrupt| (autograd's terms), not of largest |estimate|
    m0, terms = raw_atp(model, clean, corrupt, tl_metric(ans, wrong), "attn.hook_z")
    effect = np.abs(np.stack([terms[f"blocks.{layer}.attn.hook_z"].sum(dim=(0, 3)).detach().numpy() for layer in range(2)]))
    order = np.sort(effect.ravel())[::-1]
    assert order[4] - order[5] > 1e-3 * order[0]  # (no near tie at the cut)
    assert set(np.flatnonzero(done.ravel())) == set(np.argsort(-effect.ravel())[:5])


@pytest.mark.parametrize("method", ["exact", "atp"])
def test_identical_inputs_give_metric_corrupt_in_every_cell(model, task, method):
    clean, _, ans, wrong, items = task
    same = [{**it, "corrupt": it["clean"]} for it in items]
    g = grids(model, same, method=method, sites={"heads": HEADS, "resid": RESID})
    with torch.no_grad():
        m = float(tl_metric(ans, wrong)(model(clean)))
    for name in ("heads", "resid"):
        np.testing.assert_allclose(g[name].values, m, atol=1e-5)


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sae")
    g = torch.Generator().manual_seed(3)
    d, n = 32, 48
    safetensors.save_file({"W_enc": torch.randn(d, n, generator=g) * 0.3, "W_dec": torch.randn(n, d, generator=g) * 0.3,
                           "b_enc": torch.randn(n, generator=g) * 0.1, "b_dec": torch.zeros(d)},
                          str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": d, "d_sae": n, "dtype": "float32",
                                                 "apply_b_dec_to_input": True, "normalize_activations": "none",
                                                 "metadata": {"hook_name": "blocks.0.hook_resid_post"}}))
    return folder


def test_atp_on_sae_latents_equals_autograd_through_the_decoder(model, task, sae_dir):
    clean, corrupt, ans, wrong, items = task
    w = safetensors.load_file(str(sae_dir / "sae_weights.safetensors"))
    enc = lambda x: torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])  # noqa: E731
    dec = lambda f: f @ w["W_dec"] + w["b_dec"]  # noqa: E731
    point = model.blocks[0].hook_resid_post
    latents, delta = {}, {}

    def spliced(mod, args, x):  # SAELens' error term: the output stays the model's own; a latent's gradient goes through the decoder
        f = enc(x)
        latents["f"] = f.detach()
        if "d" in delta:
            return x + dec(f + delta["d"]) - dec(f)
        return None

    h = point.register_forward_hook(spliced)
    try:
        with torch.no_grad():
            model(clean)
            f_clean = latents["f"]
        delta["d"] = torch.zeros(N, T, 48, requires_grad=True)
        with torch.enable_grad():
            m = tl_metric(ans, wrong)(model(corrupt))
        f_corrupt = latents["f"]
        (grad,) = torch.autograd.grad(m, [delta["d"]])
    finally:
        h.remove()
    ref = (float(m) + ((f_clean - f_corrupt) * grad).sum(0)).numpy()[None]
    hooks = {"sae": {"at": "blocks.0.hook_resid_post", "type": "forward",
                     "actions": [{"name": "modify_output", "op": "splice", "path": str(sae_dir), "error_term": True}]}}
    g = grids(model, items, hooks=hooks, method="atp",
              sites={"lat": {"at": "blocks.0.hook_resid_post.sae.latents", "over": ["position", "latent"],
                             "dims": ["sample", "position", "latent"]}})["lat"]
    assert not hasattr(model.blocks[0].hook_resid_post, "sae")  # the splice is removed afterwards
    np.testing.assert_allclose(g.values, ref, atol=1e-4)
