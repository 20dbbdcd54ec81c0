"""evaluate on a bfloat16 classifier: ce against torch in float64 on the same bf16 logits."""

from __future__ import annotations

import h5py
import torch
import torch.nn.functional as F

import hookrun


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.body = torch.nn.Linear(6, 16)
        self.head = torch.nn.Linear(16, 5)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(6, generator=g).to(torch.bfloat16), i % 5


def test_a_bfloat16_classifiers_cross_entropy_is_not_rounded_to_bfloat16(tmp_path):
    model = Classifier().to(torch.bfloat16).eval()
    path = tmp_path / "eval.h5"
    hookrun.run({"data": {"batch_size": 8}, "device": "cpu", "progress": False,
                 "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}, "evaluate": {},
                 "hooks": {"s": {"at": "body", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.75}]}},
                 "output": {"path": str(path)}}, model=model, dataset=Items())
    x = torch.stack([Items()[i][0] for i in range(16)])
    y = torch.tensor([Items()[i][1] for i in range(16)])
    with torch.no_grad():
        clean = model(x).double()  # the bf16 model's logits, exactly, then float64 arithmetic
        h = model.body.register_forward_hook(lambda m, i, o: o * 0.75)
        steered = model(x).double()
        h.remove()
    with h5py.File(path) as f:
        got = {k: float(v) for k, v in f["evaluation/model"].attrs.items()}
    assert abs(got["ce_clean"] - F.cross_entropy(clean, y).item()) < 1e-5 * F.cross_entropy(clean, y).item()
    assert abs(got["ce_intervened"] - F.cross_entropy(steered, y).item()) < 1e-5 * F.cross_entropy(steered, y).item()
