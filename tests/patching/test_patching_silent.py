"""Patching's silent wrong numbers (issue 47 item 7, its first three cases), each compared with the
model called directly: a loop of one full forward per cell whose patch is a plain torch hook.

1. An exact grid beside another hook that changes the forward (a spliced SAE, a user's own forward
   hook, a global one): the blocks below the lowest patched one return their kept output, which is
   already the output after their hooks; the hooks must not apply a second time.
2. An attention_mask in data.inputs reaches the model in every forward of every method.
3. A hook that records beside a patching block is refused in one line before any forward.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from patch_tasks import token_task
from safetensors.torch import save_file
from toy_lm import PAD, tiny_gpt2

import hookrun
from hookrun.errors import ConfigError
from hookrun.hooks.actions import ActionEnv, ModelHold
from hookrun.runner.kinds.patching.block import load_items, parse_block
from hookrun.runner.kinds.patching.engine import PatchEngine
from hookrun.runner.kinds.patching.notebook import run_cells

N, T, V, D = 3, 6, 50, 32


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2(n_layer=3, vocab_size=V, initializer_range=0.3)  # weights large enough that cells differ


@pytest.fixture(scope="module")
def task():
    return token_task(V, N, T, at=1, low=4)


def logit_diff(ans, wrong):
    r = torch.arange(len(ans))
    return lambda logits: float((logits[r, -1, ans] - logits[r, -1, wrong]).double().mean())


def raw_loop(model, module, clean, corrupt, metric, **kwargs):
    """metric(model(corrupt)) with `module`'s output at position p taken from the clean run, one
    full forward per p, the patch a plain forward hook (registered last: after every other hook)."""
    with torch.no_grad():
        kept = {}
        h = module.register_forward_hook(lambda m, a, o: kept.setdefault("x", o.detach().clone()))
        model(clean, **kwargs)
        h.remove()
        out = []
        for p in range(clean.shape[1]):
            def patch(m, a, o, p=p):
                o = o.clone()
                o[:, p] = kept["x"][:, p]
                return o
            h = module.register_forward_hook(patch)
            out.append(metric(model(corrupt, **kwargs).logits))
            h.remove()
    return np.array(out)


def grid(model, items, site, **block):
    b = parse_block({"input": "input_ids", "sites": {"s": {"at": site, "over": ["position"]}}, **block})
    env = ActionEnv(hold=ModelHold(model))
    try:
        with PatchEngine(model, b, load_items(items, b), env) as engine:
            values, _ = run_cells(engine)
    finally:
        env.close()
    return values, engine


# -- 1. hooks beside the grid -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sae(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sae")
    g = torch.Generator().manual_seed(3)
    w = {"W_enc": torch.randn(D, 48, generator=g) * 0.3, "W_dec": torch.randn(48, D, generator=g) * 0.3,
         "b_enc": torch.randn(48, generator=g) * 0.1, "b_dec": torch.randn(D, generator=g) * 0.1}
    save_file(w, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": D, "d_sae": 48, "dtype": "float32",
                                                 "apply_b_dec_to_input": True, "normalize_activations": "none",
                                                 "metadata": {"hook_name": "transformer.h.1"}}))
    return folder, w


def test_a_spliced_sae_below_the_patched_block_applies_once(model, task, sae):
    clean, corrupt, ans, wrong, items = task
    folder, w = sae
    splice = model.transformer.h[1].register_forward_hook(  # the reference: the SAE's reconstruction, by hand
        lambda m, a, o: torch.relu((o - w["b_dec"]) @ w["W_enc"] + w["b_enc"]) @ w["W_dec"] + w["b_dec"])
    modules = {"b2": model.transformer.h[2], "qkv": model.transformer.h[2].attn.c_attn}  # qkv: every position counts
    try:
        ref = {name: raw_loop(model, m, clean, corrupt, logit_diff(ans, wrong)) for name, m in modules.items()}
    finally:
        splice.remove()
    hooks = {"sae": {"at": "transformer.h.1", "type": "forward",
                     "actions": [{"name": "modify_output", "op": "splice", "path": str(folder), "error_term": False}]}}
    got = hookrun.patch_grid(model, items, hooks=hooks, input="input_ids",
                             sites={"b2": {"at": "transformer.h.2", "over": ["position"]},
                                    "qkv": {"at": "transformer.h.2.attn.c_attn", "over": ["position"]}})
    for name in modules:
        np.testing.assert_allclose(got[name].values[0], ref[name], atol=1e-5, err_msg=name)
        assert np.ptp(ref[name]) > 1e-3  # the cells differ: the comparison is not of constants
    assert not model.transformer.h[1]._forward_hooks and "sae" not in dict(model.transformer.h[1].named_children())


def _add_output(vec):
    return lambda m, a, o: o + vec


@pytest.mark.parametrize("kind", ["forward", "forward_with_kwargs", "global", "pre_and_forward"])
def test_a_users_own_hook_on_a_skipped_block_applies_once(model, task, kind):
    """A hook hookrun does not know about, on block 0, below the patched block 1 (and, for the grid of
    block 2, on block 1 too): the route the cells take does not matter, the values are the raw loop's."""
    clean, corrupt, ans, wrong, items = task
    vec = torch.randn(D, generator=torch.Generator().manual_seed(5))
    b0 = model.transformer.h[0]
    if kind == "forward":
        handles = [b0.register_forward_hook(_add_output(vec))]
    elif kind == "forward_with_kwargs":
        handles = [b0.register_forward_hook(lambda m, a, k, o: o + vec, with_kwargs=True)]
    elif kind == "global":
        from torch.nn.modules.module import register_module_forward_hook

        handles = [register_module_forward_hook(lambda m, a, o: o + vec if m is b0 else None)]
    else:  # a pre-hook scaling block 0's input, and a forward hook adding to block 1's output
        handles = [b0.register_forward_pre_hook(lambda m, a: (a[0] * 1.5, *a[1:])),
                   model.transformer.h[1].register_forward_hook(_add_output(-vec))]
    try:
        for level in (1, 2):
            module = model.transformer.h[level]
            ref = raw_loop(model, module, clean, corrupt, logit_diff(ans, wrong))
            values, engine = grid(model, items, f"transformer.h.{level}", cells_per_forward=2)
            np.testing.assert_allclose(values, ref, atol=1e-5, err_msg=f"{kind}, block {level}")
            assert engine.route is None  # a hook hookrun did not attach: the full path (and its skipped blocks)
            assert np.ptp(ref) > 1e-3
    finally:
        for h in handles:
            h.remove()


def test_a_position_hook_turns_the_suffix_route_off(model, task):
    """A user's hook that writes position 1 of block 0's output: on the suffix route (positions p0..
    only) it would write another position; the engine takes the full path instead."""
    clean, corrupt, ans, wrong, items = task
    vec = torch.randn(D, generator=torch.Generator().manual_seed(6))

    def at_one(m, a, o):
        o = o.clone()
        o[:, 1] += vec
        return o

    h = model.transformer.h[0].register_forward_hook(at_one)
    try:
        ref = raw_loop(model, model.transformer.h[0], clean, corrupt, logit_diff(ans, wrong))
        values, engine = grid(model, items, "transformer.h.0", cells_per_forward=1)
    finally:
        h.remove()
    np.testing.assert_allclose(values, ref, atol=1e-5)
    assert engine.route is None and engine.foreign_hooks == ["transformer.h.0"]
    values, engine = grid(model, items, "transformer.h.0", cells_per_forward=1)  # no hook: the route is taken
    assert engine.route is not None and engine.route.forwards > 0 and not engine.foreign_hooks


# -- 2. an attention_mask in data.inputs -------------------------------------------------------------
@pytest.fixture(scope="module")
def padded():
    """Left-padded items (2 to 5 real tokens of 6), their mask, clean and corrupted differing at the
    first real token."""
    g = torch.Generator().manual_seed(2)
    clean, mask = torch.full((N, T), PAD), torch.zeros(N, T, dtype=torch.long)
    for i, size in enumerate((5, 3, 2)):
        clean[i, T - size:] = torch.randint(4, V, (size,), generator=g)
        mask[i, T - size:] = 1
    corrupt = clean.clone()
    for i, size in enumerate((5, 3, 2)):
        corrupt[i, T - size] = (clean[i, T - size] + 9) % (V - 4) + 4
    ans, wrong = torch.randint(0, V, (N,), generator=g), torch.randint(0, V, (N,), generator=g)
    items = [{"clean": clean[i], "corrupt": corrupt[i], "attention_mask": mask[i], "answer": ans[i], "wrong": wrong[i]}
             for i in range(N)]
    return clean, corrupt, mask, ans, wrong, items


MASKED = {"input_ids": "clean", "attention_mask": "attention_mask"}


def masked(mask):
    """The mask and the positions generate() gives left-padded items (each item's first real token at 0),
    as hookrun passes them to GPT-2 (runner/token_inputs.with_positions)."""
    return {"attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}


@pytest.mark.parametrize("inputs", [MASKED, {"attention_mask": "attention_mask"}])  # patching.input adds the ids
def test_a_file_runs_cells_and_metrics_are_the_masked_models(tmp_path, model, padded, inputs):
    clean, corrupt, mask, ans, wrong, items = padded
    metric = logit_diff(ans, wrong)
    with torch.no_grad():
        m_clean, m_corrupt = metric(model(clean, **masked(mask)).logits), metric(model(corrupt, **masked(mask)).logits)
        unmasked = metric(model(clean).logits)
    assert abs(m_clean - unmasked) > 1e-3  # the mask matters on these items
    ref = raw_loop(model, model.transformer.h[1], clean, corrupt, metric, **masked(mask))
    path = tmp_path / "masked.h5"
    hookrun.run({"progress": False, "output": {"path": str(path)}, "data": {"inputs": inputs, "target": None},
                 "patching": {"cells_per_forward": 2, "sites": {"b1": {"at": "transformer.h.1", "over": ["position"]}}}},
                model=model, dataset=items)
    g = hookrun.open_run(path).grid("b1")
    assert g.attrs["metric_clean"] == pytest.approx(m_clean, abs=1e-5)
    assert g.attrs["metric_corrupt"] == pytest.approx(m_corrupt, abs=1e-5)
    np.testing.assert_allclose(g.values[0], ref, atol=1e-5)


def test_atp_with_a_mask_equals_autograd_of_the_masked_model(model, padded):
    clean, corrupt, mask, ans, wrong, items = padded
    block = model.transformer.h[1]
    r = torch.arange(N)
    kept, delta = {}, {}
    h = block.register_forward_hook(lambda m, a, o: kept.__setitem__("x", o.detach()))
    with torch.no_grad():
        model(clean, **masked(mask))
    source = kept["x"]
    h.remove()
    h = block.register_forward_hook(lambda m, a, o: o + delta.setdefault("d", torch.zeros_like(o, requires_grad=True)))
    try:
        logits = model(corrupt, **masked(mask)).logits
        m = (logits[r, -1, ans] - logits[r, -1, wrong]).double().mean()
        (grad,) = torch.autograd.grad(m, [delta["d"]])
    finally:
        h.remove()
    h = block.register_forward_hook(lambda m, a, o: kept.__setitem__("x", o.detach()))
    with torch.no_grad():
        model(corrupt, **masked(mask))
    h.remove()
    ref = float(m.detach()) + ((source - kept["x"]).double() * grad.double()).sum(dim=(0, 2)).numpy()
    got = hookrun.patch_grid(model, items, inputs=MASKED, method="atp",
                             sites={"b1": {"at": "transformer.h.1", "over": ["position"]}})["b1"]
    np.testing.assert_allclose(got.values[0], ref, atol=1e-5)


@pytest.mark.parametrize("block", [{"method": "exact", "sites": {"b1": {"at": "transformer.h.1", "over": ["position"]}}},
                                   {"method": "atp_ig", "ig_steps": 2, "sites": {"b1": {"at": "transformer.h.1", "over": ["position"]}}},
                                   {"method": "eap", "faithfulness": {"edges": [3, 10]}},
                                   {"method": "eap_ig", "ig_steps": 2}])
def test_every_forward_of_every_method_carries_the_mask(model, padded, block):
    clean, corrupt, mask, ans, wrong, items = padded
    metric = logit_diff(ans, wrong)
    with torch.no_grad():
        m_clean, m_corrupt = metric(model(clean, **masked(mask)).logits), metric(model(corrupt, **masked(mask)).logits)
    seen = []

    def spy(m, args, kwargs):
        ids, got = kwargs["input_ids"], kwargs.get("attention_mask")
        seen.append(got is not None and torch.equal(got, mask.repeat(ids.shape[0] // N, 1)))

    h = model.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        out = hookrun.patch_grid(model, items, inputs=MASKED, **block)
    finally:
        h.remove()
    g = next(iter(out.values()))
    assert seen and all(seen), f"{seen.count(False)} of {len(seen)} forwards without the items' mask"
    assert g.attrs["metric_clean"] == pytest.approx(m_clean, abs=1e-5)
    assert g.attrs["metric_corrupt"] == pytest.approx(m_corrupt, abs=1e-5)


def test_a_mask_no_forward_receives_is_one_warning(model, padded, caplog):
    *_, items = padded
    sites = {"b1": {"at": "transformer.h.1", "over": ["position"]}}
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        hookrun.patch_grid(model, items, sites=sites, input="input_ids")
    said = [r.getMessage() for r in caplog.records if "attention_mask" in r.getMessage()]
    assert len(said) == 1 and "no forward receives, so the model runs unmasked" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        hookrun.patch_grid(model, items, sites=sites, inputs=MASKED)
    assert not [r for r in caplog.records if "attention_mask" in r.getMessage()]


@pytest.mark.parametrize(("inputs", "message"), [
    (["clean", "attention_mask"], r"data.inputs=\['clean', 'attention_mask'\]: a patching run passes its inputs by name"),
    ({"input_ids": "tokens"}, r"data.inputs.input_ids='tokens': patching.input='input_ids' takes the clean and corrupted"),
    ({"x": "corrupt"}, r"data.inputs.x='corrupt' is the clean or corrupted input, which patching sends to patching.input"),
    ({"attention_mask": "mask"}, r"data.inputs.attention_mask='mask': the items have no tensor 'mask'"),
])
def test_inputs_patching_cannot_pass_are_one_line(model, padded, inputs, message):
    *_, items = padded
    with pytest.raises(ConfigError, match=message):
        hookrun.patch_grid(model, items, inputs=inputs, sites={"b1": {"at": "transformer.h.1", "over": ["position"]}})


# -- 3. a hook that records ---------------------------------------------------------------------------
def test_a_recording_hook_beside_patching_is_refused_before_any_forward(tmp_path, model, task):
    *_, items = task
    calls = []
    h = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    hooks = {"rec": {"at": "transformer.h.0", "type": "forward", "actions": ["record"]}}
    sites = {"b1": {"at": "transformer.h.1", "over": ["position"]}}
    want = r"^hooks.rec: its action hooks.rec.actions.0 \(Record\) records captures, but a patching run writes only"
    try:
        with pytest.raises(ConfigError, match=want):
            hookrun.run({"progress": False, "output": {"path": str(tmp_path / "r.h5")}, "hooks": hooks,
                         "data": {"inputs": {"input_ids": "clean"}, "target": None}, "patching": {"sites": sites}},
                        model=model, dataset=items)
        with pytest.raises(ConfigError, match=want):
            hookrun.patch_grid(model, items, hooks=hooks, input="input_ids", sites=sites)
    finally:
        h.remove()
    assert calls == []  # refused before any forward
    assert not (tmp_path / "r.h5").exists()
    assert all(not m._forward_hooks for m in model.modules())
