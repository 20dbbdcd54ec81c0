"""/samples of a model that changes its input in place (`x.sub_(0.5).mul_(2)`, a normalisation written in
place): data.store keeps each item as it came (what the report draws under its maps), not as the forward
left it; a record run's and an evaluate run's alike."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch import nn

import hookrun


class Normalise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sub_(0.5).mul_(2.0)


@pytest.mark.parametrize("extra", [{}, {"evaluate": {}, "loss": {"_target_": "hookrun.runner.losses.cross_entropy",
                                                                  "_partial_": True}}], ids=["record", "evaluate"])
def test_stored_items_are_the_items_as_they_came(tmp_path, extra):
    torch.manual_seed(0)
    model = nn.Sequential(Normalise(), nn.Flatten(), nn.Linear(12, 4)).eval()
    g = torch.Generator().manual_seed(3)
    x, y = torch.rand(6, 3, 2, 2, generator=g), torch.randint(0, 4, (6,), generator=g)
    items = [{"image": x[i].clone(), "label": y[i]} for i in range(6)]
    hooks = {"h": {"at": "2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = {"hooks": hooks, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "c.h5")},
           "data": {"batch_size": 3, "store": ["image"], "inputs": ["image"], "target": "label"}, **extra}
    path = hookrun.run(cfg, model=model, dataset=items).path
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["samples/image"][:], x.numpy())
        np.testing.assert_array_equal(f["samples/target"][:], y.numpy())
        with torch.no_grad():
            np.testing.assert_allclose(f["captures/h/2/output"][:], model[2]((x - 0.5).flatten(1) * 2.0).numpy(),
                                       rtol=1e-5, atol=1e-6)
