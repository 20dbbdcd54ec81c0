"""Channels-last feature maps (timm's Swin: (batch, height, width, channels); a LayerNorm inside a ConvNeXt
block; torchvision's Swin) are pooled over their space with the channels as features, by the probe and
the similarity kind: checked against raw forward hooks averaged by numpy, scikit-learn's Ridge and a
numpy linear CKA (hooks/taps.py's channels_last)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

timm = pytest.importorskip("timm")
N = 16


def raw_outputs(model, x, names):
    raw = {}
    hooks = [model.get_submodule(n).register_forward_hook(
        lambda m, a, o, n=n: raw.__setitem__(n, o.detach().double().numpy())) for n in names]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return raw


def cka(a, c):
    a, c = a - a.mean(0), c - c.mean(0)
    return np.linalg.norm(a.T @ c) ** 2 / (np.linalg.norm(a.T @ a) * np.linalg.norm(c.T @ c))


def test_timm_swin_stage_probe_and_similarity_pool_space_not_channels():
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    import hookrun

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, embed_dim=16, depths=(1, 1),
                              num_heads=(1, 1), img_size=56, window_size=7, num_classes=3).eval()
    x, y = torch.randn(N, 3, 56, 56), torch.arange(N) % 3
    data = torch.utils.data.TensorDataset(x, y)
    at = ["patch_embed.proj", "layers.0", "layers.1"]
    raw = raw_outputs(model, x, at)
    feats = {"patch_embed.proj": raw["patch_embed.proj"].mean((2, 3)),  # a Conv2d: (N, C, H, W)
             "layers.0": raw["layers.0"].mean((1, 2)), "layers.1": raw["layers.1"].mean((1, 2))}  # (N, H, W, C)
    table = hookrun.probe(model, data, at=at, target="label", batch_size=8, method="ridge", control=False,
                          split={"test": 0.25, "seed": 0})
    train, _ = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    for name in at:
        f = feats[name]
        scale = StandardScaler().fit(f[train])
        ref = Ridge(alpha=1.0).fit(scale.transform(f[train]), np.eye(3)[y.numpy()[train]])
        w, b = (np.asarray(v) for v in table.weights[name])
        assert w.shape == (3, f.shape[1]), name
        np.testing.assert_allclose(f @ w.T + b, ref.predict(scale.transform(f)), atol=1e-6, err_msg=name)
    sim = np.asarray(hookrun.similarity(model, data, at=at, batch_size=8, pool="mean").values)
    want = np.array([[cka(feats[a], feats[c]) for c in at] for a in at])
    np.testing.assert_allclose(sim, want, atol=1e-9)


def test_convnext_block_norm_and_torchvision_swin_are_channels_last():
    from torchvision.models.swin_transformer import SwinTransformer

    import hookrun

    torch.manual_seed(0)
    convnext = timm.create_model("convnext_atto", pretrained=False, dims=(16, 24, 32, 40), depths=(1, 1, 1, 1),
                                 conv_mlp=False, num_classes=3).eval()  # (its blocks' norm and mlp run channels last)
    swin = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[1, 1], window_size=[7, 7],
                           num_classes=3).eval()
    x = torch.randn(N, 3, 56, 56)
    data = torch.utils.data.TensorDataset(x, torch.arange(N) % 3)
    for model, at in ((convnext, ["stages.0.blocks.0.conv_dw", "stages.0.blocks.0.norm", "stages.1"]),
                      (swin, ["features.0", "features.1", "features.2"])):
        raw = raw_outputs(model, x, at)
        last = {"stages.0.blocks.0.norm", "features.0", "features.1", "features.2"}
        feats = [raw[a].mean((1, 2)) if a in last else raw[a].mean((2, 3)) for a in at]
        sim = np.asarray(hookrun.similarity(model, data, at=at, batch_size=8, pool="mean").values)
        np.testing.assert_allclose(sim, [[cka(a, c) for c in feats] for a in feats], atol=1e-9, err_msg=str(at))


def test_a_swin_stages_input_is_steered_along_its_channels_as_the_probe_read_them(tmp_path):
    """probe_steer at a timm Swin stage's input (the output of the stage before it, (B, H, W, C)) added the
    probe's direction along dim 1, the height: a Swin stage was not among the modules whose input is
    channels last (direction.py's own test; hooks/plan.py's last_roles knew). Where H == C (16 here)
    that was silent. Reference: the same model with a raw forward pre-hook adding f w/|w| on the last axis."""
    import h5py

    import hookrun

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, embed_dim=16, depths=(1, 1),
                              num_heads=(1, 1), img_size=64, window_size=4, num_classes=3).eval()
    x, y = torch.randn(N, 3, 64, 64), torch.arange(N) % 3
    data = [{"x": x[i], "label": y[i]} for i in range(N)]
    base = {"data": {"batch_size": 8, "inputs": ["x"]}, "device": "cpu", "progress": False}
    probe = tmp_path / "p.h5"
    hookrun.run({**base, "output": {"path": str(probe)}, "probe": {"at": ["layers.0"], "target": "label",
                                                                    "pool": "mean", "control": False}},
                model=model, dataset=data)
    with h5py.File(probe, "r") as f:
        w = f["probe/000/weight"][2].astype(np.float64)
    hooks = {"s": {"at": "layers.1", "type": "forward_pre", "actions": [
        {"name": "replace_input", "op": "probe_steer", "probe": str(probe), "at": "layers.0", "label": 2, "factor": 3.0}]},
        "r": {"at": "head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    hookrun.run({**base, "output": {"path": str(tmp_path / "s.h5")}, "hooks": hooks}, model=model, dataset=data)
    v = torch.tensor(3.0 * w / np.linalg.norm(w), dtype=torch.float32)
    seen = []

    def pre(m, args):
        seen.append(tuple(args[0].shape))
        return (args[0] + v,)  # along the last axis: the channels

    h = model.layers[1].register_forward_pre_hook(pre)
    with torch.no_grad():
        want = model(x).double().numpy()
    h.remove()
    assert seen[0] == (N, 16, 16, 16)  # H == W == C: a wrong axis is not caught by its size
    with h5py.File(tmp_path / "s.h5", "r") as f:
        got = f["captures/r/head/output"][:].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
