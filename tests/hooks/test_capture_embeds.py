"""capture on a model called with inputs_embeds and an attention_mask: token means and token rows
over the real tokens only, as a raw forward hook reduced in numpy and as hookrun.run on the same items."""

from __future__ import annotations

import numpy as np
import torch
from toy_lm import tiny_gpt2

import hookrun

HOOKS = {"r": {"at": "transformer.h.0", "type": "forward",
               "actions": [{"name": "record", "what": "output", "reduce": "mean", "dims": "token"}]},
         "t": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}}


def _inputs():
    model = tiny_gpt2(0)
    ids = torch.randint(4, 64, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:], mask[2, 3:] = 0, 0
    return model, model.transformer.wte(ids).detach(), mask


def _raw(model, emb, mask) -> tuple[np.ndarray, np.ndarray]:
    """The block's output by a raw forward hook; its mean and rows over real tokens in numpy."""
    seen = []
    handle = model.transformer.h[0].register_forward_hook(lambda m, i, o: seen.append(o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        model(inputs_embeds=emb, attention_mask=mask)
    handle.remove()
    out, keep = seen[0].numpy(), mask.numpy().astype(bool)
    return np.stack([out[i][keep[i]].mean(0) for i in range(len(out))]), out[keep]


def test_capture_token_mean_with_inputs_embeds_leaves_padding_out(tmp_path) -> None:
    model, emb, mask = _inputs()
    mean, rows = _raw(model, emb, mask)
    with torch.no_grad(), hookrun.capture(model, HOOKS) as cap:
        model(inputs_embeds=emb, attention_mask=mask)
    np.testing.assert_allclose(cap["r", "transformer.h.0", "output"].numpy(), mean, atol=1e-5)
    np.testing.assert_allclose(cap["t", "transformer.h.0", "output"].numpy(), rows, atol=1e-5)

    items = [{"inputs_embeds": emb[i], "attention_mask": mask[i]} for i in range(3)]
    cfg = {"hooks": HOOKS, "data": {"batch_size": 3}, "device": "cpu", "progress": False,
           "output": {"path": str(tmp_path / "c.h5")}}
    run = hookrun.open_run(hookrun.run(cfg, model=model, dataset=items).path)
    np.testing.assert_allclose(run["r", "transformer.h.0", "output"][:], mean, atol=1e-5)
