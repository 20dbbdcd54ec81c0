"""probe.test_data's forwards run the user's modifying hooks (the test rows are read from the model as
intervened, as the training rows are) but not their records: a `record` hook had filed the test items'
outputs in the run's file as a second call of the last training batch's items (`fc/output@1`, indexed by
their sample indices), which no forward of those items made. The reference: the model's modules called
directly, the hook's op (scale) applied by hand, and scikit-learn's LogisticRegression."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import hookrun

pytest.importorskip("sklearn")
from sklearn.linear_model import LogisticRegression  # noqa: E402

N, FACTOR = 48, 0.25


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.fc = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.a(x)))


class Items(torch.utils.data.Dataset):
    def __init__(self, n: int = N, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x[:, 0] + 0.5 * self.x[:, 1] > 0).long() + (self.x[:, 2] > 0.5).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "label": self.y[i]}


def test_test_data_forwards_are_intervened_but_not_recorded(tmp_path) -> None:
    model, train, test = Net().eval(), Items(N, 0), Items(20, 1)
    hooks = {"half": {"at": "a", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": FACTOR}]},
             "logits": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = {"data": {"batch_size": 16, "inputs": ["x"]}, "device": "cpu", "progress": False, "hooks": hooks,
           "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["a"], "target": "label", "standardize": False, "C": 0.5,
                     "test_data": {"dataset": {"_target_": f"{__name__}.Items", "n": 20, "seed": 1}}}}
    hookrun.run(cfg, model=model, dataset=train)
    with torch.no_grad():
        x, xt = (model.a(d.x).double().numpy() * FACTOR for d in (train, test))  # the op's output, as the probe reads it
        logits = model.fc(torch.tanh(model.a(train.x) * FACTOR)).numpy()
    ref = LogisticRegression(C=0.5, tol=1e-10, max_iter=10000).fit(x, train.y.numpy())
    with hookrun.open_run(tmp_path / "p.h5") as run:
        caps = [(c.path, c.shape) for c in run.captures]
        recorded = run.file["captures/logits/fc/output"][:]
        row = run.probes().rows[0]
        weight, bias = run.probe_weights("a")
    assert caps == [("/captures/logits/fc/output", (N, 3))]  # (no fc/output@1 of the 20 test items)
    np.testing.assert_allclose(recorded, logits, rtol=1e-5, atol=1e-6)
    assert row["test"] == pytest.approx(ref.score(xt, test.y.numpy()), abs=1e-12)
    assert np.mean((xt @ weight.T + bias).argmax(1) == ref.predict(xt)) >= 0.995
