"""op: splice at an nn.Sequential: the SAE joins it as its child `sae`, and nn.Sequential's forward runs
every child in order, so it also ran the SAE as a last layer (no error term, no edit) before the op
spliced that again: with error_term the output was the reconstruction, not the clean output, and a
feature map's SAE stopped the run in torch's own shape error. The SAE is trained by hookrun's `sae:` kind
here; the references are numpy's TopK SAE (rescale_acts_by_decoder_norm, as cfg.json says) computed from
its sae_weights.safetensors, on the clean outputs of a raw forward hook on the same model and inputs."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

import hookrun

pytest.importorskip("sae_lens")
safetensors = pytest.importorskip("safetensors.numpy")
N, FEATURE = 64, 5


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seq_sae")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()), torch.nn.Linear(16, 3)).eval()
    data = torch.utils.data.TensorDataset(torch.randn(N, 8), torch.zeros(N, dtype=torch.long))
    hookrun.run({"data": {"batch_size": 16}, "device": "cpu", "progress": False,
                 "output": {"path": str(tmp / "train.h5")},
                 "sae": {"at": "0", "d_sae": 32, "architecture": "topk", "k": 4, "rows": 256, "batch_rows": 32,
                         "out": str(tmp / "sae")}}, model=model, dataset=data)
    cfg = json.loads((tmp / "sae" / "cfg.json").read_text())
    assert cfg["architecture"] == "topk" and cfg["rescale_acts_by_decoder_norm"] and cfg["apply_b_dec_to_input"]
    w = {k: v.astype(np.float64) for k, v in safetensors.load_file(str(tmp / "sae" / "sae_weights.safetensors")).items()}
    raw = []
    h = model[0].register_forward_hook(lambda m, a, o: raw.append(o.detach().double().numpy()))
    with torch.no_grad():
        model(data.tensors[0])
    h.remove()
    return tmp, model, data, w, raw[0], cfg["k"]


def latents(w, x, k):
    norms = np.linalg.norm(w["W_dec"], axis=1)
    pre = ((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]) * norms
    f = np.zeros_like(pre)
    top = np.argsort(-pre, axis=1)[:, :k]
    np.put_along_axis(f, top, np.maximum(np.take_along_axis(pre, top, 1), 0), 1)
    return f, norms


def spliced(tmp, model, data, name, error_term, edit):
    hooks = {"sae": {"at": "0", "type": "forward", "actions": [
                 {"name": "modify_output", "op": "splice", "path": str(tmp / "sae"), "error_term": error_term}]},
             "lat": {"at": "0.sae.latents", "type": "forward", "actions": [{"name": "modify_output", **edit}]},
             "out": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    hookrun.run({"data": {"batch_size": 16}, "device": "cpu", "progress": False,
                 "output": {"path": str(tmp / f"{name}.h5"), "overwrite": True}, "hooks": hooks}, model=model, dataset=data)
    with h5py.File(tmp / f"{name}.h5", "r") as f:
        return f["captures/out/0/output"][:].astype(np.float64)


def test_steering_a_latent_of_an_sae_spliced_at_a_sequential_adds_its_decoder_direction(trained):
    tmp, model, data, w, x, _ = trained
    got = spliced(tmp, model, data, "steer", True, {"op": "add_features", "features": {FEATURE: 3.0}})
    d = w["W_dec"][FEATURE]
    np.testing.assert_allclose(got, x + 3.0 * d / np.linalg.norm(d), rtol=1e-5, atol=1e-5)


def test_ablating_a_latent_without_the_error_term_is_the_sae_reconstruction_without_it(trained):
    tmp, model, data, w, x, k = trained
    f, norms = latents(w, x, k)
    feature = int(np.argmax((f > 0).sum(0)))  # the latent most often active
    f[:, feature] = 0
    got = spliced(tmp, model, data, "ablate", False, {"op": "zero_features", "features": [feature]})
    np.testing.assert_allclose(got, (f / norms) @ w["W_dec"] + w["b_dec"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("size", [6, 8])
def test_an_sae_trained_on_a_feature_maps_channels_splices_and_steers_at_every_position(tmp_path, size):
    """An SAE of hookrun's `sae:` kind with rows: channel (each position's channel vector of a (B, 8, 6, 6) map)
    was refused at the module it was trained on ('reads d_in=8 but ...'s output has 6 features'): the splice
    read the map's width. A map as wide as it has channels (8 x 8 x 8) was spliced along its width, without a
    word. Reference: numpy's TopK SAE from the weights file on each position's channels."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Conv2d(2, 8, 3, padding=1), torch.nn.ReLU()),
                                torch.nn.Flatten(), torch.nn.Linear(8 * size * size, 3)).eval()
    data = torch.utils.data.TensorDataset(torch.randn(16, 2, size, size), torch.zeros(16, dtype=torch.long))
    hookrun.run({"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "t.h5")},
                 "sae": {"at": "0", "rows": "channel", "budget": 16 * size * size, "d_sae": 16, "architecture": "topk", "k": 3,
                         "batch_rows": 64, "out": str(tmp_path / "sae")}}, model=model, dataset=data)
    w = {k: v.astype(np.float64) for k, v in safetensors.load_file(str(tmp_path / "sae" / "sae_weights.safetensors")).items()}
    k = json.loads((tmp_path / "sae" / "cfg.json").read_text())["k"]
    raw = []
    h = model[0].register_forward_hook(lambda m, a, o: raw.append(o.detach().double().numpy()))
    with torch.no_grad():
        model(data.tensors[0])
    h.remove()
    x = np.moveaxis(raw[0], 1, -1).reshape(-1, 8)  # each position's channels
    f, norms = latents(w, x, k)
    f[:, 2] += 1.5
    steered = np.moveaxis(((f / norms) @ w["W_dec"] + w["b_dec"]).reshape(16, size, size, 8), -1, 1)
    got = spliced(tmp_path, model, data, "map", False, {"op": "add_features", "features": {2: 1.5}})
    np.testing.assert_allclose(got, steered, rtol=1e-4, atol=1e-5)
    d = w["W_dec"][2] / np.linalg.norm(w["W_dec"][2])
    got = spliced(tmp_path, model, data, "map_error", True, {"op": "add_features", "features": {2: 1.5}})
    np.testing.assert_allclose(got, raw[0] + 1.5 * d[None, :, None, None], rtol=1e-5, atol=1e-5)
    # the latents of a map's splice are (B, H, W, d_sae): named so, and top examples rank each latent's
    # largest value over the positions (they were named channel, height, width: 'size' features of the height)
    f, _ = latents(w, x, k)
    f = f.reshape(16, size, size, 16)
    hooks = {"sae": {"at": "0", "type": "forward", "actions": [{"name": "modify_output", "op": "splice", "path": str(tmp_path / "sae")}]},
             "lat": {"at": "0.sae.latents", "type": "forward", "actions": [{"name": "record", "what": "output"},
                                                                           {"name": "top_examples", "k": 2}]}}
    hookrun.run({"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "lat.h5")},
                 "hooks": hooks}, model=model, dataset=data)
    with h5py.File(tmp_path / "lat.h5", "r") as h:
        ds = h["captures/lat/0.sae.latents/output"]
        assert list(ds.attrs["dims"]) == ["sample", "height", "width", "channel"]
        np.testing.assert_allclose(ds[:], f, rtol=1e-4, atol=1e-5)
    per = f.max(axis=(1, 2))
    with hookrun.open_run(tmp_path / "lat.h5") as r:
        assert r.top_example_modules == {"0.sae.latents": 16}
        for j in np.flatnonzero(per.max(0) > 0)[:4]:
            got = r.top_examples("0.sae.latents", int(j))
            assert [e["sample"] for e in got] == list(np.argsort(-per[:, j], kind="stable")[:2])
            np.testing.assert_allclose([e["value"] for e in got], np.sort(per[:, j])[::-1][:2], rtol=1e-4, atol=1e-6)


def test_an_sae_on_a_channels_last_maps_channels_trains_on_its_last_axis_live_and_from_a_cache(tmp_path):
    """rows: channel on a channels-last map ((B, H, W, C) after torchvision's Permute, as timm's Swin gives)
    took axis 1, the height, as the channels: the SAE trained on 6-vectors (d_in 6), live and from a cache.
    References: the cache's vectors are a raw forward hook's output rows of 8 channels; the spliced map is
    numpy's TopK SAE from the weights file on each position's last axis."""
    from torchvision.ops.misc import Permute

    from hookrun.runner.kinds.sae.data import CacheRows

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Conv2d(2, 8, 3, padding=1), Permute([0, 2, 3, 1])),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 3)).eval()
    data = torch.utils.data.TensorDataset(torch.randn(16, 2, 6, 6), torch.zeros(16, dtype=torch.long))
    raw = []
    h = model[0].register_forward_hook(lambda m, a, o: raw.append(o.detach().double().numpy()))
    with torch.no_grad():
        model(data.tensors[0])
    h.remove()
    assert raw[0].shape == (16, 6, 6, 8)
    hookrun.run({"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "c.h5")},
                 "hooks": {"map": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}},
                model=model, dataset=data)
    stream = CacheRows(str(tmp_path / "c.h5"), "map/0/output", 16 * 36, False, vectors="channel")
    assert (stream.d_in, stream.n_rows) == (8, 16 * 36)
    np.testing.assert_allclose(next(iter(stream)).numpy(), raw[0].reshape(-1, 8), rtol=1e-6)
    stream.close()
    hookrun.run({"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "t.h5")},
                 "sae": {"at": "0", "rows": "channel", "budget": 16 * 36, "d_sae": 16, "architecture": "topk", "k": 3,
                         "batch_rows": 64, "out": str(tmp_path / "sae")}}, model=model, dataset=data)
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert cfg["d_in"] == 8
    w = {k: v.astype(np.float64) for k, v in safetensors.load_file(str(tmp_path / "sae" / "sae_weights.safetensors")).items()}
    f, norms = latents(w, raw[0].reshape(-1, 8), cfg["k"])
    f[:, 2] += 1.5
    steered = ((f / norms) @ w["W_dec"] + w["b_dec"]).reshape(16, 6, 6, 8)
    got = spliced(tmp_path, model, data, "map", False, {"op": "add_features", "features": {2: 1.5}})
    np.testing.assert_allclose(got, steered, rtol=1e-4, atol=1e-5)
    with h5py.File(tmp_path / "map.h5", "r") as h:  # (the SAE, the Sequential's new last child, passes its layout on)
        assert list(h["captures/out/0/output"].attrs["dims"]) == ["sample", "height", "width", "channel"]
