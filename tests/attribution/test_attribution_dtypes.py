"""Attribution of a bfloat16 model (numpy and HDF5 have no bfloat16): its rows are stored as float32,
equal to captum's on the same bfloat16 weights and batches, in a file run and in hookrun.attribute."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun
from hookrun.data.shapes import shapes
from hookrun.models.tiny_cnn import tiny_cnn

captum_attr = pytest.importorskip("captum.attr")

N, B = 6, 4  # a last batch of 2


@pytest.fixture(scope="module")
def model_data():
    model = tiny_cnn().to(torch.bfloat16)
    ds = shapes(N)
    return model, [(ds[i][0].to(torch.bfloat16), ds[i][1]) for i in range(N)]


def reference(model, data):
    """captum's IntegratedGradients (zero baseline, 4 steps) on the bfloat16 model, batch by batch."""
    out = []
    for s in range(0, N, B):
        x = torch.stack([d[0] for d in data[s: s + B]])
        y = torch.tensor([d[1] for d in data[s: s + B]])
        out.append(captum_attr.IntegratedGradients(model).attribute(x, baselines=torch.zeros_like(x), n_steps=4, target=y))
    return torch.cat(out).float().detach().numpy()


def test_a_bfloat16_model_is_attributed_and_written_as_float32(tmp_path, model_data):
    model, data = model_data
    want = reference(model, data)
    path = tmp_path / "bf16.h5"
    cfg = {"data": {"batch_size": B}, "device": "cpu", "progress": False, "output": {"path": str(path)},
           "attribution": {"method": "integrated_gradients", "steps": 4, "measure": {"deletion": 4}}}
    hookrun.run(cfg, model=model, dataset=data)  # (failed at batch 0: "TypeError: Got unsupported ScalarType BFloat16")
    a = hookrun.open_run(path).attribution()
    assert a.dtype == np.float32 and a.shape == (N, 1, 32, 32)
    np.testing.assert_array_equal(a.values, want)
    with torch.no_grad():
        logits = model(torch.stack([d[0] for d in data])).float()
    np.testing.assert_array_equal(a["logit"].values, logits[torch.arange(N), a["target"].values].numpy())
    rows = hookrun.attribute(model, data, batch_size=B, method="integrated_gradients", steps=4)
    assert rows["attribution"].dtype == np.float32
    np.testing.assert_array_equal(rows["attribution"], want)
