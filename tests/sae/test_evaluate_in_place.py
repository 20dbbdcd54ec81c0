"""evaluate on a classifier that changes its input in place (`x.sub_(0.5).mul_(2)`, a normalisation
written in place): its clean, intervened and ablated forwards each see the batch as it came, so every
metric and the recorded output equal plain torch on the same function written out of place."""

from __future__ import annotations

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from toy_models import in_place_net

import hookrun


class Images(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(3)
        self.x, self.y = torch.rand(6, 3, 2, 2, generator=g), torch.randint(0, 4, (6,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def test_each_forward_sees_the_batch_as_it_came(tmp_path):
    hooks = {"damp": {"at": "2", "type": "forward", "actions": [
        {"name": "modify_output", "op": "scale", "factor": 0.5}, {"name": "record", "what": "output"}]}}
    cfg = {"hooks": hooks, "evaluate": {"ablation": "zero"}, "device": "cpu", "progress": False,
           "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True},
           "data": {"batch_size": 3}, "output": {"path": str(tmp_path / "c.h5")}}
    path = hookrun.run(cfg, model=in_place_net(True), dataset=Images()).path
    plain, data = in_place_net(False), Images()
    x, y = data.x, data.y
    with torch.no_grad():
        h = plain[2](plain[1](plain[0](x)))
        clean, inter, abl = plain(x), plain[4](plain[3](h * 0.5)), plain[4](plain[3](torch.zeros_like(h)))
    want = {f"ce_{k}": F.cross_entropy(v, y, reduction="none").double().view(2, 3).mean(1).numpy()
            for k, v in (("clean", clean), ("intervened", inter), ("ablated", abl))}
    with h5py.File(path) as f:
        np.testing.assert_allclose(f["captures/damp/2/output"][:], (h * 0.5).numpy(), rtol=0, atol=1e-6)
        for k, v in want.items():
            np.testing.assert_allclose(f[f"evaluation/model/{k}"][:], v, rtol=1e-5, err_msg=k)
