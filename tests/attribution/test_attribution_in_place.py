"""Attribution of a classifier that changes its input in place (`x.sub_(0.5).mul_(2)`, a normalisation
written in place): every forward a method makes of the batch gets it as it came, so each method equals
captum's class on the same function written out of place (where captum on the in-place model itself
forwards a changed input, or refuses a leaf that requires grad)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from toy_models import in_place_net

import hookrun

captum_attr = pytest.importorskip("captum.attr")




@pytest.mark.parametrize("block, make, kw", [
    ({"method": "occlusion", "window": [3, 1, 1]}, captum_attr.Occlusion, {"sliding_window_shapes": (3, 1, 1)}),
    ({"method": "integrated_gradients", "steps": 4, "baseline": "zero"}, captum_attr.IntegratedGradients, {"n_steps": 4}),
    ({"method": "saliency"}, captum_attr.Saliency, {}),
], ids=["occlusion", "ig", "saliency"])
def test_each_forward_sees_the_batch_as_it_came(block, make, kw):
    g = torch.Generator().manual_seed(3)
    x, y = torch.rand(4, 3, 2, 2, generator=g), torch.randint(0, 4, (4,), generator=g)
    data = [(x[i].clone(), y[i]) for i in range(4)]
    rows = hookrun.attribute(in_place_net(True), data, batch_size=4, **block)
    plain = in_place_net(False)
    want = make(plain).attribute(x.clone().requires_grad_(block["method"] != "occlusion"), target=y, **kw)
    np.testing.assert_allclose(rows["attribution"], want.detach().numpy(), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        np.testing.assert_allclose(rows["logit"], plain(x)[torch.arange(4), y].numpy(), rtol=1e-5, atol=1e-6)


def test_a_file_run_with_a_hook_attributes_the_batch_as_it_came(tmp_path):
    """A file run with a hook of the user's: its plain forward (the records) runs on its own copy."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.rand(4, 3, 2, 2, generator=g), torch.randint(0, 4, (4,), generator=g)
    hooks = {"h": {"at": "2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = {"hooks": hooks, "attribution": {"method": "occlusion", "window": [3, 1, 1]}, "device": "cpu",
           "progress": False, "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "c.h5")}}
    path = hookrun.run(cfg, model=in_place_net(True), dataset=[(x[i].clone(), y[i]) for i in range(4)]).path
    plain = in_place_net(False)
    want = captum_attr.Occlusion(plain).attribute(x.clone(), target=y, sliding_window_shapes=(3, 1, 1))
    with torch.no_grad(), h5py.File(path) as f:
        np.testing.assert_allclose(f["captures/attribution/__model__/attribution"][:], want.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(f["captures/h/2/output"][:], plain[2](plain[1](plain[0](x))).numpy(), rtol=1e-5, atol=1e-6)
