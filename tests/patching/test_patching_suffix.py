"""Exact grids on the suffix route (runner/kinds/patching/suffix.py): a HookedTransformer's and an HF
GPT-2's packed forwards run from their first patched position on, from the lowest patched block,
unembedded where the metric reads; the grids equal TransformerLens 3.9's patching functions and a
loop of one raw-hooked full forward per cell, and each test reads the engine's counters to know the
route was (or, for a model it does not know, was not) taken."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("transformer_lens")
from tl_models import hooked_transformer  # noqa: E402
from toy_lm import tiny_gpt2  # noqa: E402
from transformer_lens import patching  # noqa: E402

from hookrun.hooks.actions import (
    ActionEnv,  # noqa: E402
    ModelHold,  # noqa: E402
)
from hookrun.runner.kinds.patching import families  # noqa: E402
from hookrun.runner.kinds.patching.block import (
    load_items,  # noqa: E402
    parse_block,  # noqa: E402
)
from hookrun.runner.kinds.patching.engine import PatchEngine  # noqa: E402
from hookrun.runner.kinds.patching.notebook import run_cells  # noqa: E402

N, T, V = 3, 7, 40
HEADS = {"at": "blocks.*.attn.hook_z", "over": ["position", "head"], "dims": ["sample", "position", "head", "feature"]}


def make_task(vocab, seed=1, n=N, t=T):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, vocab, (n, t), generator=g)
    corrupt = clean.clone()
    corrupt[:, 0] = torch.randint(3, vocab, (n,), generator=g)  # cells at position 0 move the metric too
    corrupt[:, t // 2] = torch.randint(3, vocab, (n,), generator=g)
    ans, wrong = torch.randint(0, vocab, (n,), generator=g), torch.randint(0, vocab, (n,), generator=g)
    pos = torch.tensor([t - 1, t - 2, t // 2 + 1][:n])  # each item's metric position (an item key)
    items = [{"clean": clean[i], "corrupt": corrupt[i], "answer": ans[i], "wrong": wrong[i], "pos": pos[i]} for i in range(n)]
    return clean, corrupt, ans, wrong, pos, items


def engine_grids(model, items, input, **block):
    """Every site's grid [module, over...] and the engine (its route and counters)."""
    b = parse_block({"input": input, **block})
    env = ActionEnv(hold=ModelHold(model))
    try:
        with PatchEngine(model, b, load_items(items, b, None, torch.device("cpu")), env) as engine:
            values, _ = run_cells(engine)
    finally:
        env.close()
    return {g.name: values[g.offset:g.offset + g.size].reshape(g.shape) for g in engine.layout.grids}, engine


def took_route(engine, only=True):
    assert engine.route is not None and engine.route.forwards > 0
    if only:
        assert engine.full_forwards == 0


@pytest.fixture(scope="module")
def tl_model():
    return hooked_transformer(V, n_layers=3, d_model=32, n_ctx=16, d_head=8, act_fn="gelu")


@pytest.fixture(scope="module")
def tl_task():
    return make_task(V)


def test_heads_resid_attn_and_mlp_grids_equal_transformer_lens_on_the_route(tl_model, tl_task):
    clean, corrupt, ans, wrong, _, items = tl_task
    _, cache = tl_model.run_with_cache(clean)
    r = torch.arange(N)
    metric = lambda lg: (lg[r, -1, ans] - lg[r, -1, wrong]).mean()  # noqa: E731
    sites = {"heads": HEADS, "resid": {"at": "blocks.*.hook_resid_pre", "over": ["position"]},
             "attn": {"at": "blocks.*.hook_attn_out", "over": ["position"]},
             "mlp": {"at": "blocks.*.hook_mlp_out", "over": ["position"]}}
    g, engine = engine_grids(tl_model, items, "input", sites=sites)
    took_route(engine)
    for name, fn in (("heads", patching.get_act_patch_attn_head_out_by_pos), ("resid", patching.get_act_patch_resid_pre),
                     ("attn", patching.get_act_patch_attn_out), ("mlp", patching.get_act_patch_mlp_out)):
        ref = fn(tl_model, corrupt, cache, metric).numpy()
        np.testing.assert_allclose(g[name], ref, atol=1e-5, err_msg=name)
    assert np.abs(g["resid"][:, 0]).max() > 1e-3 and np.abs(g["resid"][:, -1]).max() > 1e-3  # position 0 and the last move
    # block 0's input between the two corrupted tokens (positions 1, 2) is equal in both runs: metric_base, no forward
    assert engine.equal_cells >= 2
    np.testing.assert_array_equal(g["resid"][0, 1:3], engine.metric_base)


def raw_hf_loop(model, sites, clean, corrupt, metric):
    """One full forward per (module, position) cell: a raw forward hook puts the clean run's output there."""
    out = {}
    with torch.no_grad():
        for name, mods in sites.items():
            kept = {}
            hs = [m.register_forward_hook(lambda mod, a, o, i=i, kept=kept: kept.__setitem__(i, o)) for i, m in enumerate(mods)]
            model(clean)
            for h in hs:
                h.remove()
            grid = np.zeros((len(mods), clean.shape[1]))
            for i, m in enumerate(mods):
                for p in range(clean.shape[1]):
                    def patch(mod, a, o, i=i, p=p, kept=kept):
                        first = o[0] if isinstance(o, tuple) else o
                        src = kept[i][0] if isinstance(kept[i], tuple) else kept[i]
                        first = first.clone()
                        first[:, p] = src[:, p]
                        return (first, *o[1:]) if isinstance(o, tuple) else first
                    h = m.register_forward_hook(patch)
                    grid[i, p] = float(metric(model(corrupt).logits).double().mean())
                    h.remove()
            out[name] = grid
    return out


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_gpt2_grids_with_per_item_positions_equal_a_raw_hook_loop_on_the_route(attn):
    model = tiny_gpt2(attn_implementation=attn, n_layer=3, n_embd=32, n_head=4, vocab_size=V, n_positions=16)
    clean, corrupt, ans, wrong, pos, items = make_task(V, seed=2)
    r = torch.arange(N)
    metric = lambda lg: torch.log_softmax(lg[r, pos], -1)[r, ans]  # noqa: E731
    blocks = model.transformer.h
    sites = {"resid": [b for b in blocks], "attn": [b.attn for b in blocks], "mlp": [b.mlp for b in blocks]}
    ref = raw_hf_loop(model, sites, clean, corrupt, metric)
    g, engine = engine_grids(model, items, "input_ids", metric={"name": "logprob", "position": "pos"}, cells_per_forward=2,
                             sites={"resid": {"at": "transformer.h.*", "over": ["position"]},
                                    "attn": {"at": "transformer.h.*.attn", "over": ["position"]},
                                    "mlp": {"at": "transformer.h.*.mlp", "over": ["position"]}})
    took_route(engine)
    for name in sites:
        np.testing.assert_allclose(g[name], ref[name], atol=1e-5, err_msg=name)
    assert np.abs(g["resid"][:, 0] - engine.metric_base).max() > 1e-4  # a cell at position 0 moves the metric


def test_tiny_lm_grid_equals_a_raw_hook_loop_on_the_route():
    from hookrun.models.tiny_lm import tiny_lm

    model = tiny_lm().eval()
    clean, corrupt, ans, wrong, _, items = make_task(200, seed=3, t=6)
    r = torch.arange(N)
    metric = lambda lg: lg[r, -1, ans] - lg[r, -1, wrong]  # noqa: E731
    ref = raw_hf_loop(model, {"mlp": [b.mlp for b in model.transformer.h]}, clean, corrupt, metric)
    g, engine = engine_grids(model, items, "input_ids", cells_per_forward=2,
                             sites={"mlp": {"at": "transformer.h.*.mlp", "over": ["position"]}})
    took_route(engine)
    np.testing.assert_allclose(g["mlp"], ref["mlp"], atol=1e-4)


def test_cells_without_a_position_take_the_full_path_beside_the_route(tl_model, tl_task):
    clean, corrupt, ans, wrong, _, items = tl_task
    _, cache = tl_model.run_with_cache(clean)
    r = torch.arange(N)
    metric = lambda lg: (lg[r, -1, ans] - lg[r, -1, wrong]).mean()  # noqa: E731
    heads_all = {**HEADS, "over": ["head"]}
    g, engine = engine_grids(tl_model, items, "input", sites={"all": heads_all, "heads": HEADS})
    took_route(engine, only=False)
    assert engine.full_forwards > 0
    np.testing.assert_allclose(g["all"], patching.get_act_patch_attn_head_out_all_pos(tl_model, corrupt, cache, metric).numpy(), atol=1e-5)
    np.testing.assert_allclose(g["heads"], patching.get_act_patch_attn_head_out_by_pos(tl_model, corrupt, cache, metric).numpy(), atol=1e-5)


class Mixer(nn.Module):
    """A plain nn.Module (no family): embedding, a stack of linear blocks mixing positions causally, head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.e, self.b, self.h = nn.Embedding(V, 8), nn.ModuleList(nn.Linear(8, 8) for _ in range(2)), nn.Linear(8, V)

    def forward(self, input_ids):
        x = self.e(input_ids)
        for layer in self.b:
            x = x + layer(x).cumsum(1)
        return self.h(x)


def test_a_bidirectional_model_and_a_plain_module_take_the_full_path(tl_task):
    clean, corrupt, ans, wrong, _, items = tl_task
    r = torch.arange(N)
    metric = lambda lg: (lg[r, -1, ans] - lg[r, -1, wrong]).mean()  # noqa: E731
    bert_like = hooked_transformer(V, n_layers=2, d_model=32, n_ctx=16, d_head=8, attention_dir="bidirectional")
    _, cache = bert_like.run_with_cache(clean)
    g, engine = engine_grids(bert_like, items, "input", sites={"heads": HEADS})
    assert engine.route is None and engine.full_forwards > 0
    np.testing.assert_allclose(g["heads"], patching.get_act_patch_attn_head_out_by_pos(bert_like, corrupt, cache, metric).numpy(), atol=1e-5)
    mixer = Mixer().eval()
    g, engine = engine_grids(mixer, items, "input_ids", sites={"b": {"at": "b.*", "over": ["position"]}})
    assert engine.route is None and engine.full_forwards > 0
    with torch.no_grad():  # the reference: one forward per cell, a raw hook
        kept = mixer.b[0](mixer.e(clean))  # block 0's clean output
        ref = np.zeros(T)
        for p in range(T):
            def patch(m, a, o, p=p):
                o = o.clone()
                o[:, p] = kept[:, p]
                return o
            h = mixer.b[0].register_forward_hook(patch)
            ref[p] = float(metric(mixer(corrupt)))
            h.remove()
    np.testing.assert_allclose(g["b"][0], ref, atol=1e-5)


def test_a_user_metric_or_a_resumed_forward_that_differs_turns_the_route_off(tl_model, tl_task, monkeypatch):
    clean, corrupt, ans, wrong, _, items = tl_task
    _, cache = tl_model.run_with_cache(clean)
    r = torch.arange(N)
    ref = patching.get_act_patch_resid_pre(tl_model, corrupt, cache, lambda lg: (lg[r, -1, ans] - lg[r, -1, wrong]).mean()).numpy()
    resid = {"resid": {"at": "blocks.*.hook_resid_pre", "over": ["position"]}}
    def user(logits, it):
        rows = torch.arange(logits.shape[0])
        return logits[rows, -1, it["answer"]] - logits[rows, -1, it["wrong"]]

    g, engine = engine_grids(tl_model, items, "input", metric=user, sites=resid)
    assert engine.route is None
    np.testing.assert_allclose(g["resid"], ref, atol=1e-5)
    run = families._TL.run  # a cache that is off by one position: the check at the start refuses the route
    monkeypatch.setattr(families._TL, "run", lambda self, ids, x, level, c: run(self, ids, x.roll(1, 1), level, c))
    g, engine = engine_grids(tl_model, items, "input", sites=resid)
    assert engine.route is None
    np.testing.assert_allclose(g["resid"], ref, atol=1e-5)
