"""evaluate on outputs that are not (batch, classes): a segmenter's (batch, classes, H, W) logits
with loss=cross_entropy, whose KL is over the classes (dim 1, as torch's cross_entropy reads them),
checked against plain torch on the same weights and inputs."""

from __future__ import annotations

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import hookrun


class Segmenter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Conv2d(2, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 5, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


class Pixels(Dataset):
    """(2, 4, 7) images and a class (0..4) per pixel."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(2, 4, 7, generator=g), torch.randint(0, 5, (4, 7), generator=g)


def pixel_kl(clean, other) -> torch.Tensor:
    """Per pixel: KL(clean || other) summed over the classes (dim 1)."""
    lpc, lpo = F.log_softmax(clean.double(), 1), F.log_softmax(other.double(), 1)
    return (lpc.exp() * (lpc - lpo)).sum(1).reshape(-1)


def test_a_segmenters_kl_is_over_its_classes_not_its_width(tmp_path):
    torch.manual_seed(0)
    model = Segmenter().eval()
    hooks = {"damp": {"at": "body", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.3}]}}
    cfg = {"hooks": hooks, "evaluate": {"ablation": "zero"}, "device": "cpu", "progress": False,
           "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True},
           "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "s.h5")}}
    path = hookrun.run(cfg, model=model, dataset=Pixels()).path
    kl = {"kl_intervened": [], "kl_ablated": []}
    ce = []
    for x, y in DataLoader(Pixels(), batch_size=4):
        with torch.no_grad():
            clean, inter = model(x), model.head(torch.relu(model.body(x) * 0.3))
            abl = model.head(torch.relu(torch.zeros_like(model.body(x))))
        kl["kl_intervened"].append(pixel_kl(clean, inter))
        kl["kl_ablated"].append(pixel_kl(clean, abl))
        ce.append(F.cross_entropy(inter, y).item())
    with h5py.File(path) as f:
        g = f["evaluation/model"]
        for name, terms in kl.items():
            np.testing.assert_allclose(g[name][:], [t.mean().item() for t in terms], rtol=1e-5, err_msg=name)
            np.testing.assert_allclose(g.attrs[name], torch.cat(terms).mean().item(), rtol=1e-5, err_msg=name)
        np.testing.assert_array_equal(g["kl_count"][:], [4 * 28, 2 * 28])  # a position per pixel
        np.testing.assert_allclose(g["ce_intervened"][:], ce, rtol=1e-5)
