"""Attribution of a bfloat16 model (numpy and HDF5 have no bfloat16): its rows are stored as float32,
equal to captum's on the same bfloat16 weights and batches, in a file run and in hookrun.attribute; and
grad_cam refused, in one line before any batch, at a module whose output is not feature maps."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import hookrun
from hookrun.data.shapes import shapes
from hookrun.errors import ConfigError
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


def test_grad_cam_at_a_module_without_feature_maps_is_refused_before_any_batch(tmp_path):
    """captum's LayerGradCam at `fc` gave the target's logit as the "map", and at a token model's block
    (sample, 1, feature): the positions summed away, filed as a position axis of length 1."""
    from hookrun.data.text import text
    from hookrun.errors import ConfigError
    from hookrun.models.tiny_lm import tiny_lm

    model, ds = tiny_cnn(), shapes(4)
    with pytest.raises(ConfigError) as e:
        hookrun.attribute(model, ds, batch_size=4, method="grad_cam", at="fc")
    assert str(e.value) == (
        "attribution.at='fc': grad_cam weighs the channels of feature maps (sample, channel, height, width), but the "
        "module gives (sample, 4): it has no spatial axes; name a convolutional module (e.g. at: block3.0), or use "
        "integrated_gradients or input_x_gradient")
    path = tmp_path / "fc.h5"
    cfg = {"data": {"batch_size": 4}, "device": "cpu", "progress": False, "output": {"path": str(path)},
           "attribution": {"method": "grad_cam", "at": "fc"}}
    with pytest.raises(ConfigError, match="has no spatial axes"):
        hookrun.run(cfg, model=model, dataset=ds)
    assert not path.exists()
    lm, text_ds = tiny_lm().eval(), text(files="pydoc_topics", max_length=12, limit=2)
    with pytest.raises(ConfigError, match=r"gives \(sample, 12, \d+\): a token model's output is \(sample, position, "
                                          r"feature\), not channels and space"):
        hookrun.attribute(lm, text_ds, batch_size=2, method="grad_cam", at="transformer.h.0", target="predicted")
    cams = hookrun.attribute(model, ds, batch_size=4, method="grad_cam", at="block3")["attribution"]  # feature maps: as before
    x = torch.stack([ds[i][0] for i in range(4)])
    want = captum_attr.LayerGradCam(model, model.block3).attribute(x, target=torch.tensor([ds[i][1] for i in range(4)]))
    np.testing.assert_allclose(cams, want.detach().numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("memory", [-5, 0])
def test_a_memory_budget_of_zero_or_less_bytes_is_refused(tmp_path, memory):
    """An int budget skipped parse_bytes' check: memory=-5 ran with one row per forward."""
    from hookrun.errors import ConfigError

    want = f"attribution.memory={memory}; give bytes as a number or with a unit (512MB, 2GiB)"
    with pytest.raises(ConfigError) as e:
        hookrun.attribute(tiny_cnn(), shapes(2), batch_size=2, method="saliency", memory=memory)
    assert str(e.value) == want
    path = tmp_path / "m.h5"
    cfg = {"data": {"batch_size": 2}, "device": "cpu", "progress": False, "output": {"path": str(path)},
           "attribution": {"method": "saliency", "memory": memory}}
    with pytest.raises(ConfigError, match=f"^{want.replace('(', '[(]').replace(')', '[)]')}$"):
        hookrun.run(cfg, model=tiny_cnn(), dataset=shapes(2))
    assert not path.exists()


@pytest.mark.parametrize("size", [0, -2, 2.5, True, "4"])
def test_a_batch_size_that_is_not_a_whole_number_of_at_least_one_is_one_line(size):
    """batch_size=0 ended in torch's ValueError from the DataLoader, with a traceback."""
    model, ds = tiny_cnn().eval(), shapes(size=4)
    with pytest.raises(ConfigError, match=r"^attribute: batch_size must be a whole number of at least 1 \(data.batch_size of a "
                                          rf"file run\), got {re.escape(repr(size))}$"):
        hookrun.attribute(model, ds, batch_size=size, method="saliency")


def test_a_numpy_batch_size_is_taken_as_its_number():
    model, ds = tiny_cnn().eval(), shapes(size=4)
    got = hookrun.attribute(model, ds, batch_size=np.int64(3), method="saliency")
    x = torch.stack([ds[i][0] for i in range(4)])  # the reference: captum's Saliency on the same weights
    want = captum_attr.Saliency(model).attribute(x, target=torch.tensor([int(ds[i][1]) for i in range(4)]))
    np.testing.assert_allclose(got["attribution"], want.numpy(), rtol=1e-5, atol=1e-7)
