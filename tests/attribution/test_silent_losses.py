"""Silent wrong numbers and silent losses (issue 47 item 7): attribution's curves at a layer without
spatial axes, LRP on a model its composite has no rule for (or a composite that cannot run on it), a
user's object in a reference cycle under `python -m hookrun`, and a second Ctrl-C while a batch is
written. References: a raw
timm / torchvision ViT and zennit itself, plain Python's `__del__`, plain h5py and the model's own
module called directly."""

from __future__ import annotations

import os
import signal
import threading
import time

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT
from shapes_fixtures import data, model  # noqa: F401  (fixtures: the shipped tiny_cnn, 8 shapes)
from toy_runs import RECORD_BODY, toy_cfg
from warm_python import python as warm

import hookrun
from hookrun.errors import ConfigError
from hookrun.output.process import Interrupted
from hookrun.store.h5store import H5Store

N, B = 8, 4



def attribution_cfg(path, **block):
    return {"data": {"batch_size": B}, "device": "cpu", "progress": False, "output": {"path": str(path)},
            "attribution": block}


# -- 1. deletion / insertion at a layer without spatial axes ------------------------------------------

@pytest.mark.parametrize("method", ["integrated_gradients", "grad_cam"])
def test_measure_at_a_layer_without_spatial_axes_is_one_line_before_any_batch(tmp_path, model, data, method):
    block = {"method": method, "at": "fc", "steps": 2, "measure": {"deletion": 4, "insertion": 4}}
    message = (r"attribution.measure: deletion and insertion rank the input's pixels by the attribution, but "
               r"at='fc' gives \(sample, 4\), which has no spatial axes to rank; attribute to a module whose output "
               r"has height and width \(e.g. at: block3.0\), or at: input, or leave measure out")
    path = tmp_path / "fc.h5"
    with pytest.raises(ConfigError, match=message) as exc:
        hookrun.run(attribution_cfg(path, **block), model=model, dataset=data)
    assert "\n" not in str(exc.value)
    assert not path.exists()  # refused before the file, so before any batch
    with pytest.raises(ConfigError, match=message):
        hookrun.attribute(model, data, batch_size=B, **block)
    # a layer with spatial axes still measures: its curve's first point is the model's own probability
    rows = hookrun.attribute(model, data, batch_size=B, **{**block, "at": "block3"})
    assert rows["deletion"].shape == (N, 5)
    np.testing.assert_allclose(rows["deletion"][:, 0], rows["prob"], rtol=1e-6)


# -- 2. LRP on modules no rule of the composite covers -------------------------------------------------

def tiny_vit() -> torch.nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=8, in_chans=1, num_classes=4, embed_dim=32, depth=1,
                             num_heads=2).eval()


def test_lrp_on_a_vision_transformer_is_refused_naming_the_modules_without_a_rule(tmp_path, data):
    pytest.importorskip("timm")
    pytest.importorskip("zennit")
    from zennit.attribution import Gradient
    from zennit.composites import EpsilonPlusFlat

    vit = tiny_vit()
    x = torch.stack([data[i][0] for i in range(B)])
    with Gradient(model=vit, composite=EpsilonPlusFlat()) as attributor:  # what the run returned before
        _, relevance = attributor(x, torch.eye(4)[[data[i][1] for i in range(B)]])
    assert not torch.allclose(relevance.flatten(1).sum(1), torch.ones(B), atol=0.1)  # not conserved: not LRP's
    message = (r"attribution.method=lrp: the composite epsilon_plus_flat has no rule for VisionTransformer \(the "
               r"model's cls_token, pos_embed\), LayerNorm \(blocks.0.norm1, blocks.0.norm2, norm\), Attention "
               r"\(blocks.0.attn\); LRP would be wrong: use a model of Conv/Linear/BatchNorm/ReLU/pooling or "
               r"another method")
    path = tmp_path / "vit.h5"
    with pytest.raises(ConfigError, match=message) as exc:
        hookrun.run(attribution_cfg(path, method="lrp"), model=vit, dataset=data)
    assert "\n" not in str(exc.value)
    assert not path.exists()
    with pytest.raises(ConfigError, match=message):
        hookrun.attribute(vit, data, batch_size=B, method="lrp")


def test_lrp_names_torch_multihead_attention_which_zennit_only_passes_through(data):
    pytest.importorskip("zennit")
    import torchvision

    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2,
                                               hidden_dim=32, mlp_dim=64, num_classes=4).eval()
    gray = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 1), vit).eval()
    with pytest.raises(ConfigError, match=r"no rule for .*MultiheadAttention \(1.encoder.layers.encoder_layer_0."
                                          r"self_attention\)"):
        hookrun.attribute(gray, data, batch_size=B, method="lrp")


def test_lrp_on_a_plain_cnn_still_equals_zennit(model, data):
    pytest.importorskip("zennit")
    from zennit.attribution import Gradient
    from zennit.composites import EpsilonPlusFlat

    got = hookrun.attribute(model, data, batch_size=B, method="lrp")["attribution"]
    x = torch.stack([data[i][0] for i in range(N)])
    with Gradient(model=model, composite=EpsilonPlusFlat()) as attributor:
        _, want = attributor(x, torch.eye(4)[[data[i][1] for i in range(N)]])
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-6)


class FunctionalRelu(torch.nn.Module):
    """A CNN whose ReLUs are torch.relu calls: no nn.ReLU module for guided backprop's rule."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(1, 4, 3), torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


class Linear(torch.nn.Module):
    """No convolution: nowhere for epsilon_gamma_box's box rule."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32 * 32, 4)

    def forward(self, x):
        return self.fc(x.flatten(1))


@pytest.mark.parametrize("block, message", [
    ({"composite": "epsilon_gamma_box"}, r"attribution.composite=epsilon_gamma_box: its box rule \(the first "
     r"convolution's\) needs the range of that layer's input; give low and high"),
    ({"composite": "epsilon_gamma_box", "low": 1, "high": 0}, r"attribution.low=1.0, high=0.0: each low must be below "
     r"its high"),
    ({"composite": "epsilon_gamma_box", "low": [0, 0, 0], "high": [1, 0, 1]}, r"attribution.low=\[0.0, 0.0, 0.0\], "
     r"high=\[1.0, 0.0, 1.0\]: each low must be below its high"),
    ({"composite": "epsilon_gamma_box", "low": [0, 0], "high": [1, 1, 1]}, r"attribution.low=\[0.0, 0.0\], "
     r"high=\[1.0, 1.0, 1.0\]: give one value per channel in both, or one number each"),
    ({"composite": "epsilon_gamma_box", "low": "zero", "high": 1}, r"attribution.low='zero'; give a number"),
    ({"composite": "epsilon_plus", "low": 0}, r"attribution.low: the box rule's range, used only by method=lrp "
     r"with composite=epsilon_gamma_box"),
], ids=["box_without_range", "low_above_high", "a_channel_empty", "lengths", "not_a_number", "range_without_box"])
def test_composite_keys_are_one_line_before_the_model_is_built(tmp_path, monkeypatch, block, message):
    pytest.importorskip("zennit")
    import hookrun.models

    monkeypatch.setattr(hookrun.models, "tiny_cnn", lambda **kw: pytest.fail("the model was built"))
    path = tmp_path / "bad.h5"
    cfg = {**attribution_cfg(path, method="lrp", **block), "model": {"_target_": "hookrun.models.tiny_cnn"},
           "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": N}, "batch_size": B}}
    with pytest.raises(ConfigError, match=message) as exc:
        hookrun.run(cfg)
    assert "\n" not in str(exc.value) and not path.exists()


@pytest.mark.parametrize("block, live, message", [
    ({"composite": "epsilon_gamma_box", "low": [0, 0], "high": [1, 1]}, None,
     r"attribution.low=\[0.0, 0.0\]: 2 values for an input of 1 channel\(s\); give one number, or one per channel"),
    ({"composite": "guided_backprop"}, FunctionalRelu, r"attribution.method=lrp: the composite guided_backprop changes "
     r"the gradient of torch.nn.ReLU modules, and FunctionalRelu has none"),
    ({"composite": "epsilon_gamma_box", "low": 0, "high": 1}, Linear, r"attribution.composite=epsilon_gamma_box: its "
     r"box rule goes on the first convolution, and Linear has none \(low and high would go unused\); use "
     r"composite=epsilon_plus"),
], ids=["box_channels", "no_relu_module", "no_convolution"])
def test_composites_that_cannot_run_on_the_model_are_one_line_before_any_batch(tmp_path, model, data, block, live,
                                                                                message):
    pytest.importorskip("zennit")
    path = tmp_path / "bad.h5"
    with pytest.raises(ConfigError, match=message) as exc:
        hookrun.run(attribution_cfg(path, method="lrp", **block), model=live() if live else model, dataset=data)
    assert "\n" not in str(exc.value) and not path.exists()


# -- 3. the exit's freeze leaves no unreachable object uncollected -------------------------------------

CYCLE_DATA = '''import torch


class CycleData(torch.utils.data.Dataset):
    """Images of the tiny CNN's shape, the data set in a reference cycle with itself."""

    def __init__(self):
        self.me = self

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((1, 32, 32), float(i)), i

    def __del__(self):
        print("cycle data freed", flush=True)
'''


@pytest.mark.slow
def test_a_data_set_in_a_reference_cycle_is_freed_under_python_m_hookrun(tmp_path):
    (tmp_path / "cycle_data.py").write_text(CYCLE_DATA)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = warm(["-m", "hookrun", "model=tiny_cnn", "data=custom", "imports=[cycle_data]",
                 "data.dataset._target_=cycle_data.CycleData", "progress=false", f"hydra.run.dir={tmp_path / 'run'}",
                 "hooks={r: {at: fc, type: forward, actions: [record]}}"],
                cwd=tmp_path, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines().count("cycle data freed") == 1  # as under plain main()
    with h5py.File(tmp_path / "run" / "captures.h5") as f:
        assert f.attrs["status"] == "complete" and f["captures/r/fc/output"].shape == (4, 4)


# -- 4. a second Ctrl-C while a batch is being written ------------------------------------------------

def test_a_second_sigint_while_a_batch_is_written_leaves_counts_equal_to_rows_and_resume_completes(
        tmp_path, monkeypatch, caplog):
    """The first batch's rows are appended, then (before its counts) the writer is slow: a first SIGINT
    asks the loop to stop, a second one comes while the loop waits for the writer. The file must
    count exactly the rows it holds, and resume must give the rows an uninterrupted run writes. Six batches
    of two: the loop (at most two batches queued ahead) is still short of the last batch when the writer
    ends its sleep, so the run is interrupted even where CPython folds the two signals into one (a signal
    that comes while the main thread waits in C is only handled when it wakes)."""
    from toy_models import CountingNet, SignedRows

    caplog.set_level("INFO", logger="hookrun")
    torch.manual_seed(0)
    net = CountingNet().eval()
    full = hookrun.run(toy_cfg(tmp_path / "full", hooks=RECORD_BODY, **{"data.batch_size": 2}), model=net).path
    original = H5Store._write

    def slow(self, rec, *args):
        original(self, rec, *args)  # the batch's rows are in the file; its counts come after
        if rec.step == 0:
            os.kill(os.getpid(), signal.SIGINT)  # stop after the batch in flight
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()  # again, while the writer drains
            time.sleep(1.5)

    monkeypatch.setattr(H5Store, "_write", slow)
    cfg = toy_cfg(tmp_path / "part", hooks=RECORD_BODY, **{"data.batch_size": 2})
    with pytest.raises(Interrupted) as info:
        hookrun.run(cfg, model=net)
    time.sleep(1.5)  # (a writer left running would go on now)
    monkeypatch.setattr(H5Store, "_write", original)
    with h5py.File(cfg["output"]["path"]) as f:
        rows = f["samples/index"].shape[0]
        assert f.attrs["status"] == "interrupted"
        assert (f.attrs["samples_complete"], f.attrs["steps_complete"]) == (rows, rows // 2)
        assert f["captures/b/body/output"].shape[0] == f["samples/step"].shape[0] == rows
    assert rows % 2 == 0 and 2 <= rows <= 8  # 2: the queued batches dropped; at most batch 0, the two queued and the one in flight
    assert f"interrupted by SIGINT after {rows // 2} batches" in str(info.value) and info.value.exit_code == 130
    assert f"interrupted: {rows // 2} batches, {rows} samples" in caplog.text  # (the log said 0 batches after a second signal)
    hookrun.run({**cfg, "resume": True}, model=net)
    x = torch.stack([SignedRows()[i][0] for i in range(12)])
    with torch.no_grad():
        want = net.body(x).numpy()
    with h5py.File(cfg["output"]["path"]) as got, h5py.File(full) as whole:
        assert got.attrs["status"] == "complete" and got.attrs["samples_complete"] == 12
        np.testing.assert_array_equal(got["samples/index"][:], np.arange(12))
        np.testing.assert_array_equal(got["captures/b/body/output"][:], whole["captures/b/body/output"][:])
        np.testing.assert_allclose(got["captures/b/body/output"][:], want, rtol=1e-6, atol=1e-7)
