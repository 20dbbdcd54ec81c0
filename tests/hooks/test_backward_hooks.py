"""A full backward hook on a module whose output is then modified in place (ResNet's bn2 before
`out += identity`). Reference: torch.autograd.grad on the same model."""

from __future__ import annotations

import h5py
import numpy as np
import torch
from conftest import make_cfg, small_resnet

import hookrun


def test_a_backward_hook_on_bn2_before_out_plus_identity_works(tmp_path, checkpoint, dataset):
    hooks = {"b": {"at": "layer1.0.bn2", "type": "backward", "actions": ["record"]}}
    cfg = make_cfg(tmp_path, checkpoint, hooks, mode="grad",
                   loss={"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True})
    path = hookrun.run(cfg).path
    model = small_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.eval()
    for m in model.modules():
        if getattr(m, "inplace", False):
            m.inplace = False
    seen = {}  # bn2's input and output as copies: the reference gradients are d(loss)/d(those)
    model.layer1[0].conv2.register_forward_hook(lambda m, i, o: seen.setdefault("in", []).append(o.clone()) or seen["in"][-1])
    model.layer1[0].bn2.register_forward_hook(lambda m, i, o: seen.setdefault("out", []).append(o.clone()) or seen["out"][-1])
    grads_in, grads_out = [], []
    for start in range(0, len(dataset), 4):
        seen.clear()
        x = torch.stack([dataset[i][0] for i in range(start, start + 4)])
        y = torch.stack([dataset[i][1] for i in range(start, start + 4)])
        loss = torch.nn.functional.cross_entropy(model(x.requires_grad_(True)), y)
        g_in, g_out = torch.autograd.grad(loss, [seen["in"][0], seen["out"][0]])
        grads_in.append(g_in)
        grads_out.append(g_out)
    with h5py.File(path) as f:
        assert f.attrs["status"] == "complete"
        np.testing.assert_allclose(f["captures/b/layer1.0.bn2/grad_output"][:], torch.cat(grads_out).numpy(), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(f["captures/b/layer1.0.bn2/grad_input"][:], torch.cat(grads_in).numpy(), rtol=1e-4, atol=1e-7)
