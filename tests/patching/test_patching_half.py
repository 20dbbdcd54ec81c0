"""A half-precision model's patching grid. logit_diff took logits[answer] - logits[wrong] in float16 and
rounded the difference to float16's step (0.0078 near 10): tiny_lm in float16 gave metric_clean 8.08333
where the model's own half logits give 8.08236, and cells off by up to 0.0016. Reference: a one-cell-at-a-time
loop of raw forward hooks on the same half model, the difference of its logits taken in float64."""

from __future__ import annotations

import numpy as np
import torch

import hookrun
from hookrun.models.tiny_lm import tiny_lm

N, T = 3, 6


def first(o):
    return o[0] if isinstance(o, tuple) else o  # a GPT-2 block's output: a tuple in older transformers


def logit_diff(logits, ans, wrong):
    lg = logits[:, -1].double()
    return (lg[torch.arange(N), ans] - lg[torch.arange(N), wrong]).mean().item()


def test_a_half_model_grid_equals_raw_hooks_on_its_own_half_logits():
    model = tiny_lm().eval().half()
    g = torch.Generator().manual_seed(0)
    v = model.config.vocab_size
    clean, corrupt = torch.randint(0, v, (N, T), generator=g), torch.randint(0, v, (N, T), generator=g)
    ans, wrong = torch.randint(0, v, (N,), generator=g), torch.randint(0, v, (N,), generator=g)
    items = [{"clean": clean[i], "corrupt": corrupt[i], "answer": ans[i], "wrong": wrong[i]} for i in range(N)]
    grid = hookrun.patch_grid(model, items, sites={"resid": {"at": "transformer.h.*", "over": ["position"]}})["resid"]
    blocks = model.transformer.h
    with torch.no_grad():
        keep = {}
        hs = [b.register_forward_hook(lambda m, a, o, i=i: keep.__setitem__(i, first(o))) for i, b in enumerate(blocks)]
        want_clean = logit_diff(model(clean).logits, ans, wrong)
        for h in hs:
            h.remove()
        want_corrupt = logit_diff(model(corrupt).logits, ans, wrong)
        ref = np.zeros((len(blocks), T))
        for layer, block in enumerate(blocks):
            for pos in range(T):
                def patch(m, a, o, layer=layer, pos=pos):
                    t = first(o).clone()
                    t[:, pos] = keep[layer][:, pos]
                    return (t, *o[1:]) if isinstance(o, tuple) else t
                h = block.register_forward_hook(patch)
                ref[layer, pos] = logit_diff(model(corrupt).logits, ans, wrong)
                h.remove()
    assert grid.attrs["metric_clean"] == want_clean  # was 8.083333 against 8.082357
    assert grid.attrs["metric_corrupt"] == want_corrupt
    np.testing.assert_allclose(grid.values, ref, rtol=0, atol=1e-9)
