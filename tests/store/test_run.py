"""Whole runs through hookrun.run(): the file's layout and attributes, options, and errors."""

from __future__ import annotations

import pickle
import urllib.error
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torchvision
import yaml
from conftest import batches, make_cfg

import hookrun
from hookrun.errors import ConfigError, HookrunError

FMAP = {"fmap": {"at": "layer1.0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


def reference_layer1(model, dataset):
    with torch.no_grad():
        return torch.cat([model.layer1[0](model.maxpool(model.relu(model.bn1(model.conv1(x)))))
                          for x, _ in batches(dataset)]).numpy()


def test_file_is_self_describing(run_hooks, checkpoint):
    f = run_hooks(FMAP)
    attrs = dict(f.attrs)
    assert attrs["status"] == "complete" and attrs["format_version"] == "1"
    assert attrs["model_class"] == "torchvision.models.resnet.ResNet"
    assert attrs["torch_version"] == torch.__version__ and attrs["hookrun_version"] == hookrun.__version__
    assert attrs["device"] == "cpu" and attrs["mode"] == "eval" and attrs["steps_complete"] == 3
    config = yaml.safe_load(attrs["config"])
    assert config["hooks"] == FMAP and config["model"]["checkpoint"] == str(checkpoint)
    ds = f["captures/fmap/layer1.0/output"]
    assert {k: ds.attrs[k] for k in ("hook", "module", "type", "role", "call", "rows")} == {
        "hook": "fmap", "module": "layer1.0", "type": "forward", "role": "output", "call": 0, "rows": "samples"}
    assert ds.maxshape[0] is None and ds.chunks is not None
    np.testing.assert_array_equal(f["samples/step"][:], np.repeat([0, 1, 2], 4))


def test_output_dtype_and_compression(run_hooks, reference_model, dataset):
    f = run_hooks(FMAP, **{"output.dtype": "float16", "output.compression": "gzip"})
    ds = f["captures/fmap/layer1.0/output"]
    assert ds.dtype == np.float16 and ds.compression == "gzip"
    assert ds.attrs["torch_dtype"] == "float32"
    np.testing.assert_allclose(ds[:], reference_layer1(reference_model, dataset), rtol=2e-3, atol=2e-3)


def test_limit_runs_only_that_many_batches(run_hooks):
    f = run_hooks(FMAP, **{"data.limit": 2})
    assert f["captures/fmap/layer1.0/output"].shape[0] == 8
    np.testing.assert_array_equal(f["samples/index"][:], np.arange(8))


def test_capture_that_skips_a_batch_gets_its_own_index(tmp_path):
    cfg = make_cfg(tmp_path, "", {"e": {"at": "extra", "type": "forward", "actions": [{"name": "record", "what": "output"}]}})
    cfg["model"] = {"_target_": "toy_models.EveryOtherBatch"}
    cfg["data"]["dataset"] = {"_target_": "toy_models.SignedRows"}
    with h5py.File(hookrun.run(cfg).path) as f:
        ds = f["captures/e/extra/output"]
        assert ds.shape == (8, 4) and ds.attrs["index"] == "output.index"
        np.testing.assert_array_equal(f["captures/e/extra/output.index"][:], [0, 1, 2, 3, 8, 9, 10, 11])


def test_existing_output_is_never_overwritten_unless_asked(tmp_path, checkpoint):
    cfg = make_cfg(tmp_path, checkpoint, FMAP, **{"data.limit": 1})
    first = hookrun.run(cfg).path
    before = first.read_bytes()
    with pytest.raises(ConfigError, match="exists; set output.overwrite=true"):
        hookrun.run(cfg)
    assert first.read_bytes() == before
    cfg["output"]["overwrite"] = True
    assert hookrun.run(cfg).path == first


def test_failed_run_leaves_status_failed(tmp_path, checkpoint):
    cfg = make_cfg(tmp_path, checkpoint, FMAP, mode="grad", loss={"_target_": "toy_models.NotAModel"})
    with pytest.raises(ConfigError):
        hookrun.run(cfg)  # the loss is not callable: refused before the file exists
    assert not (tmp_path / "captures.h5").exists()
    cfg["loss"] = {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}
    cfg["data"]["dataset"] = {"_target_": "hookrun.data.RandomTensors", "n": 12, "shape": [3, 32, 32], "num_classes": 10000}
    with pytest.raises((IndexError, RuntimeError)):  # a target outside the 10 classes fails mid-run
        hookrun.run(cfg)
    with h5py.File(tmp_path / "captures.h5") as f:
        assert f.attrs["status"] == "failed"


def save_pickled_object(path):
    with open(path, "wb") as fh:
        pickle.dump({"weights": object()}, fh)


@pytest.mark.parametrize("over, message", [
    ({"mode": "grad"}, "mode=grad needs a loss"),
    ({"device": "cuda"} if not torch.cuda.is_available() else {"device": "cuda:99"}, "device=cuda"),
    ({"device": "tpu"}, "device: 'tpu' is not"),
    ({"data.dataset": {"_target_": "toy_models.Strings"}}, "an item is a str; hookrun needs a tensor, a tuple/list or a dict"),
    ({"model": {"_target_": "toy_models.NotAModel"}}, "not a torch.nn.Module"),
    ({"model": {"_target_": "no_such_pkg.Net"}}, "cannot import 'no_such_pkg.Net'"),
    ({"model.checkpoint": "/nonexistent/ckpt.pt"}, "model.checkpoint: no file"),
    ({"data.limit": 0}, "data.limit must be at least 1"),
    ({"data.batch_size": 0}, "data.batch_size must be at least 1"),
    ({"output.compression": "zip"}, "Invalid value 'zip'"),
    ({"output.path": "/proc/forbidden/x.h5"}, "output.path: cannot create the folder"),
    ({"imports": ["no_such_module"]}, "imports: cannot import 'no_such_module'"),
    ({"bogus_key": 1}, "bogus_key"),
])
def test_bad_config_is_refused_before_any_batch(tmp_path, checkpoint, over, message):
    with pytest.raises(HookrunError, match=message):
        hookrun.run(make_cfg(tmp_path, checkpoint, FMAP, **over))
    assert not (tmp_path / "captures.h5").exists()


def test_checkpoint_that_is_not_a_state_dict_is_refused(tmp_path, checkpoint):
    bad = tmp_path / "bad.pt"
    save_pickled_object(bad)
    with pytest.raises(ConfigError, match=r"not a plain state_dict \(it is not a file torch.save wrote\); save one with"):
        hookrun.run(make_cfg(tmp_path, bad, FMAP))  # (a bare pickle)
    torch.save({"weights": object()}, bad)
    with pytest.raises(ConfigError, match=r"not a plain state_dict \(it holds a Python object \(object\), which hookrun "
                                          r"never unpickles\); save one with torch.save") as err:
        hookrun.run(make_cfg(tmp_path, bad, FMAP))
    assert "\x1b" not in str(err.value) and "weights_only=False" not in str(err.value)  # (torch's page, colours and all)
    torch.save({"fc.weight": torch.zeros(3)}, bad)  # too few keys
    with pytest.raises(ConfigError, match="does not fit ResNet: missing keys"):
        hookrun.run(make_cfg(tmp_path, bad, FMAP))
    state = torch.load(checkpoint, weights_only=True)
    state["fc.weight"] = torch.zeros(3, 512)
    torch.save(state, bad)
    with pytest.raises(ConfigError, match="size mismatch for fc.weight"):
        hookrun.run(make_cfg(tmp_path, bad, FMAP))
    # a second model's checkpoint (similarity.with.model) is named by its own key in every message,
    # a training checkpoint's {"model": state_dict} wrapper included
    from hookrun.config.checkpoint import load_checkpoint

    torch.save({"model": {"fc.weight": torch.zeros(3)}}, bad)
    with pytest.raises(ConfigError, match=r"^similarity\.with\.model\.checkpoint: .* does not fit Linear: missing keys"):
        load_checkpoint(torch.nn.Linear(2, 2), str(bad), "similarity.with.model")



def test_a_checkpoint_without_num_batches_tracked_loads_as_torch_loads_it(tmp_path):
    """A state_dict from before BatchNorm counted its batches (no num_batches_tracked, no version metadata)
    was refused ('missing keys [bn1.num_batches_tracked, ...]'), though torch's own load_state_dict,
    strict, takes it (BatchNorm fills the counter in). The model is torch's, on the same weights."""
    from hookrun.config.build import build_model

    torch.manual_seed(7)
    state = {k: v for k, v in torchvision.models.resnet18().state_dict().items() if "num_batches_tracked" not in k}
    torch.save(state, tmp_path / "old.pt")
    reference = torchvision.models.resnet18()
    reference.load_state_dict(torch.load(tmp_path / "old.pt", weights_only=True))  # strict, as torch does it
    node = {"_target_": "torchvision.models.resnet18", "weights": None, "checkpoint": str(tmp_path / "old.pt")}
    model = build_model(node, torch.device("cpu"), progress=False)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference.eval()(x), rtol=0, atol=0)
    assert model.bn1.num_batches_tracked.item() == reference.bn1.num_batches_tracked.item() == 0


def test_a_checkpoint_of_a_wrapped_model_names_the_prefix(tmp_path):
    """A DDP checkpoint (every key 'module.'-prefixed) was refused naming missing and unexpected keys only."""
    from hookrun.config.checkpoint import load_checkpoint

    state = {"module." + k: v for k, v in torch.nn.Linear(2, 2).state_dict().items()}
    torch.save(state, tmp_path / "ddp.pt")
    with pytest.raises(ConfigError) as got:
        load_checkpoint(torch.nn.Linear(2, 2), str(tmp_path / "ddp.pt"))
    assert str(got.value) == (f"model.checkpoint: {str(tmp_path / 'ddp.pt')!r} does not fit Linear: missing keys ['bias', "
                              f"'weight'], unexpected keys ['module.bias', 'module.weight']; every key starts with 'module.' "
                              f"(a DataParallel/DDP, torch.compile or Lightning wrapper's state_dict): save the inner "
                              f"model's state_dict, or the keys without 'module.'")

def torchvision_cache(tmp_path, monkeypatch) -> Path:
    """An empty torch hub cache of the test's own (torch reads TORCH_HOME at each call)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    folder = tmp_path / "torch_home" / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    return folder


def test_weights_default_loads_torchvision_cached_weights(tmp_path, monkeypatch, dataset):
    cached = torchvision_cache(tmp_path, monkeypatch)
    torch.manual_seed(99)
    pretrained = torchvision.models.resnet18(weights=None)  # stands in for the real ImageNet file
    torch.save(pretrained.state_dict(), cached / "resnet18-f37072fd.pth")
    cfg = make_cfg(tmp_path, "", {"logits": {"at": "fc", "type": "forward", "actions": ["record"]}})
    cfg["model"] = {"_target_": "torchvision.models.resnet18", "weights": "DEFAULT"}
    with h5py.File(hookrun.run(cfg).path) as f:
        got = f["captures/logits/fc/output"][:]
    with torch.no_grad():
        expected = torch.cat([pretrained.eval()(x) for x, _ in batches(dataset)]).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_weights_that_cannot_be_downloaded_say_where_to_put_them(tmp_path, monkeypatch):
    cached = torchvision_cache(tmp_path, monkeypatch)

    def offline(url, *args, **kwargs):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    cfg = make_cfg(tmp_path, "", FMAP)
    cfg["model"] = {"_target_": "torchvision.models.resnet18", "weights": "DEFAULT"}
    with pytest.raises(ConfigError) as info:
        hookrun.run(cfg)
    message = str(info.value)
    assert "model.weights=DEFAULT: the pretrained weights are not in the torch hub cache" in message
    assert str(cached / "resnet18-f37072fd.pth") in message and "model.checkpoint=PATH" in message
    assert not (tmp_path / "captures.h5").exists()
