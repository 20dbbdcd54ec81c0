"""record on channels-last feature maps (timm's Swin stages and blocks' norms, ConvNeXt's channels-last norm,
torchvision's Permute([0, 2, 3, 1])): (batch, height, width, channels) is named by meaning in the stored `dims`
attribute and `height`, `width`, `channel`, `spatial` find those axes in reduce and select; checked against a
raw forward hook on the same tiny model reduced by numpy over the right axes, the attribute read with h5py,
and a channels-first conv's records left as they were."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun

timm = pytest.importorskip("timm")
N = 4
SWIN = {"_target_": "hookrun.models.timm_model", "name": "swin_tiny_patch4_window7_224", "pretrained": False,
        "embed_dim": 16, "depths": [1, 1], "num_heads": [1, 1], "img_size": 56, "window_size": 7, "num_classes": 3}
RECORDS = {  # hook name -> record params
    "mean_hw": {"reduce": "mean", "dims": ["height", "width"]},
    "spatial": {"reduce": "mean", "dims": "spatial"},
    "max_ch": {"reduce": "max", "dims": "channel"},
    "sel": {"select": [{"dim": "channel", "index": [3, 0]}, {"dim": "width", "index": "1:3"}]},
    "raw": {},
}
REFERENCE = {  # on the raw (N, H, W, C) output
    "mean_hw": (lambda a: a.mean((1, 2)), ["sample", "channel"]),
    "spatial": (lambda a: a.mean((1, 2)), ["sample", "channel"]),
    "max_ch": (lambda a: a.max(3), ["sample", "height", "width"]),
    "sel": (lambda a: a[:, :, 1:3][..., [3, 0]], ["sample", "height", "width", "channel"]),
    "raw": (lambda a: a, ["sample", "height", "width", "channel"]),
}


def run(tmp_path, model_cfg, at, records, seed=3):
    hooks = {name: {"at": at, "type": "forward", "actions": [{"name": "record", "what": "output", **params}]}
             for name, params in records.items()}
    cfg = {"model": model_cfg, "device": "cpu", "progress": False, "seed": seed, "hooks": hooks,
           "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": N, "shape": [3, 56, 56],
                                "num_classes": 3, "seed": 7}, "batch_size": 2},
           "output": {"path": str(tmp_path / "captures.h5")}}
    return hookrun.run(cfg).path


def raw_output(model, at, n=N):
    """The module's output under a plain forward hook, on the run's own inputs (RandomTensors, seed 7)."""
    from hookrun.data import RandomTensors

    data = RandomTensors(n=n, shape=[3, 56, 56], num_classes=3, seed=7)
    x = torch.stack([data[i][0] for i in range(n)])
    seen = []
    h = model.get_submodule(at).register_forward_hook(lambda m, a, o: seen.append(o.detach().double().numpy()))
    with torch.no_grad():
        model(x)
    h.remove()
    return seen[0]


def assert_channels_last_records(path, at, a, names=tuple(REFERENCE)):
    """Each record `names` of RECORDS at `at` equals numpy's on the raw (N, H, W, C) output, its dims named so."""
    with h5py.File(path, "r") as f:
        for name in names:
            ref, dims = REFERENCE[name]
            ds = f[f"captures/{name}/{at}/output"]
            np.testing.assert_allclose(ds[:], ref(a), rtol=1e-5, atol=1e-5, err_msg=name)
            assert list(ds.attrs["dims"]) == dims, name


def swin_model():
    torch.manual_seed(0)
    kw = {k: v for k, v in SWIN.items() if k not in ("_target_", "name", "pretrained")}
    return timm.create_model(SWIN["name"], pretrained=False, **kw).eval()


@pytest.mark.parametrize("at", ["layers.1", "layers.0.blocks.0.norm1", "norm"])
def test_timm_swin_records_reduce_and_select_height_width_channel_by_meaning(tmp_path, at):
    model = swin_model()
    torch.manual_seed(0)  # the run builds the same weights: compared below through a saved checkpoint
    ckpt = tmp_path / "swin.pt"
    torch.save(model.state_dict(), ckpt)
    path = run(tmp_path, {**SWIN, "checkpoint": str(ckpt)}, at, RECORDS)
    a = raw_output(model, at)
    assert a.ndim == 4 and a.shape[1] == a.shape[2] and a.shape[3] != a.shape[1]  # (N, H, W, C), H = W != C
    assert_channels_last_records(path, at, a)


def test_torchvision_permute_to_nhwc_is_channels_last(tmp_path):
    from torchvision.ops.misc import Permute

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 8, stride=8), Permute([0, 2, 3, 1]), torch.nn.Flatten(),
                                torch.nn.Linear(6 * 49, 3)).eval()
    ckpt = tmp_path / "m.pt"
    torch.save(model, ckpt)
    cfg = {"_target_": "torch.load", "f": str(ckpt), "weights_only": False}
    path = run(tmp_path, cfg, "1", {k: RECORDS[k] for k in ("mean_hw", "max_ch", "raw")})
    a = raw_output(model, "1")
    assert_channels_last_records(path, "1", a, ("mean_hw", "max_ch", "raw"))


def test_a_channels_first_conv_keeps_channel_height_width(tmp_path):
    model = swin_model()
    ckpt = tmp_path / "swin.pt"
    torch.save(model.state_dict(), ckpt)
    at = "patch_embed.proj"  # a Conv2d in the same channels-last model: (N, C, H, W)
    path = run(tmp_path, {**SWIN, "checkpoint": str(ckpt)}, at, RECORDS)
    a = raw_output(model, at)
    want = {"mean_hw": (a.mean((2, 3)), ["sample", "channel"]), "spatial": (a.mean((2, 3)), ["sample", "channel"]),
            "max_ch": (a.max(1), ["sample", "height", "width"]),
            "sel": (a[:, [3, 0]][..., 1:3], ["sample", "channel", "height", "width"]),
            "raw": (a, ["sample", "channel", "height", "width"])}
    with h5py.File(path, "r") as f:
        for name, (ref, dims) in want.items():
            ds = f[f"captures/{name}/{at}/output"]
            np.testing.assert_allclose(ds[:], ref, rtol=1e-5, atol=1e-5, err_msg=name)
            assert list(ds.attrs["dims"]) == dims, name


def test_inputs_are_channels_last_where_the_module_keeps_their_layout(tmp_path):
    """A Swin stage's input is the stage before's (N, H, W, C); a Permute's input is (N, C, H, W)."""
    from torchvision.ops.misc import Permute

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 8, stride=8), Permute([0, 2, 3, 1]), torch.nn.LayerNorm(6),
                                torch.nn.Flatten(), torch.nn.Linear(6 * 49, 3)).eval()
    ckpt = tmp_path / "m.pt"
    torch.save(model, ckpt)
    hooks = {f"h{at}": {"at": at, "type": "forward", "actions": [
        {"name": "record", "what": "input", "reduce": "mean", "dims": "spatial"}]} for at in ("1", "2")}
    cfg = {"model": {"_target_": "torch.load", "f": str(ckpt), "weights_only": False}, "device": "cpu",
           "progress": False, "hooks": hooks, "output": {"path": str(tmp_path / "captures.h5")},
           "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": N, "shape": [3, 56, 56],
                                "num_classes": 3, "seed": 7}, "batch_size": 2}}
    path = hookrun.run(cfg).path
    conv = raw_output(model, "0")  # the Permute's input, (N, C, H, W)
    with h5py.File(path, "r") as f:
        np.testing.assert_allclose(f["captures/h1/1/input"][:], conv.mean((2, 3)), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(f["captures/h2/2/input"][:], conv.mean((2, 3)), rtol=1e-5, atol=1e-5)
        assert list(f["captures/h1/1/input"].attrs["dims"]) == list(f["captures/h2/2/input"].attrs["dims"]) == \
            ["sample", "channel"]


def test_top_examples_on_a_swin_stage_takes_each_channels_max_over_height_and_width(tmp_path):
    """top_examples read every 4-D map as (batch, C, H, W): at a Swin stage, (batch, H, W, C), its
    'features' were the rows of the map. Its features are the channels, each sample's value the
    channel's max over H and W, as a raw hook and numpy give them."""
    model = swin_model()
    ckpt = tmp_path / "swin.pt"
    torch.save(model.state_dict(), ckpt)
    cfg = {"model": {**SWIN, "checkpoint": str(ckpt)}, "device": "cpu", "progress": False, "seed": 3,
           "hooks": {"t": {"at": "layers.1", "type": "forward", "actions": [{"name": "top_examples", "k": 2}]}},
           "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": N, "shape": [3, 56, 56],
                                "num_classes": 3, "seed": 7}, "batch_size": 2},
           "output": {"path": str(tmp_path / "captures.h5")}}
    path = hookrun.run(cfg).path
    per = raw_output(model, "layers.1").max(axis=(1, 2))  # (sample, channel)
    with hookrun.open_run(path) as run:
        for c in (0, 5, per.shape[1] - 1):
            ex = run.top_examples("layers.1", c)
            want = np.argsort(-per[:, c], kind="stable")[:2]
            assert [e["sample"] for e in ex] == list(want)
            np.testing.assert_allclose([e["value"] for e in ex], per[want, c], rtol=1e-5)
        with pytest.raises(LookupError, match=f"features 0..{per.shape[1] - 1}"):
            run.top_examples("layers.1", per.shape[1])  # no more features than channels


CONVNEXT = {"_target_": "hookrun.models.timm_model", "name": "convnext_atto", "pretrained": False, "conv_mlp": False,
            "depths": [1, 1, 1, 1], "dims": [16, 24, 32, 40], "num_classes": 3}


@pytest.mark.parametrize("at", ["stages.0.blocks.0.mlp", "stages.0.blocks.0.mlp.act", "stages.0.blocks.0.mlp.drop2"])
def test_a_convnext_blocks_mlp_and_its_activation_are_channels_last(tmp_path, at):
    """timm's ConvNeXt block (conv_mlp=False) permutes to (N, H, W, C) before its norm and Mlp: the Mlp
    (Linear, GELU, Dropout, Linear) and its activation and dropout were read as (N, C, H, W), so
    `dims: [height, width]` averaged over width and channels and the stored dims named them wrongly."""
    torch.manual_seed(0)
    kw = {k: v for k, v in CONVNEXT.items() if k not in ("_target_", "name", "pretrained")}
    model = timm.create_model(CONVNEXT["name"], pretrained=False, **kw).eval()
    ckpt = tmp_path / "convnext.pt"
    torch.save(model.state_dict(), ckpt)
    path = run(tmp_path, {**CONVNEXT, "checkpoint": str(ckpt)}, at, RECORDS)
    a = raw_output(model, at)
    assert a.ndim == 4 and a.shape[1] == a.shape[2] == 14 and a.shape[3] in (16, 64)  # (N, H, W, C)
    assert_channels_last_records(path, at, a)


def test_torchvision_convnext_gelu_between_its_linears_is_channels_last_and_its_layernorm2d_input_is_not(tmp_path):
    """torchvision's CNBlock is Sequential(Conv2d, Permute to NHWC, LayerNorm, Linear, GELU, Linear, Permute
    back): its GELU's map is (N, H, W, C); a LayerNorm2d's input stays (N, C, H, W)."""
    from torchvision.models.convnext import CNBlock, LayerNorm2d

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 8, stride=8), CNBlock(6, 1e-6, 0.0), LayerNorm2d(6),
                                torch.nn.Flatten(), torch.nn.Linear(6 * 49, 3)).eval()
    ckpt = tmp_path / "m.pt"
    torch.save(model, ckpt)
    cfg = {"_target_": "torch.load", "f": str(ckpt), "weights_only": False}
    path = run(tmp_path, cfg, "1.block.4", {k: RECORDS[k] for k in ("mean_hw", "max_ch", "raw")})
    a = raw_output(model, "1.block.4")
    assert a.shape == (N, 7, 7, 24)
    assert_channels_last_records(path, "1.block.4", a, ("mean_hw", "max_ch", "raw"))
    from hookrun.hooks.plan import last_roles

    assert "input" not in last_roles(model[2], model) and last_roles(model[2], model) == ()


def test_grad_cam_of_a_swin_stage_weighs_its_channels_in_plot_and_report(tmp_path, monkeypatch):
    """plot's and the report's Grad-CAM read every map as (sample, C, H, W): a Swin stage's recorded map
    and gradient, (sample, H, W, C), were averaged over (W, C) and summed over H. The maps are those of
    a raw forward hook and torch.autograd.grad of the target logits, the channels on the last axis."""
    from hookrun.analysis import gradcam as plot_cam
    from hookrun.analysis.report import gradcam_section

    model = swin_model()
    ckpt = tmp_path / "swin.pt"
    torch.save(model.state_dict(), ckpt)
    cfg = {"model": {**SWIN, "checkpoint": str(ckpt)}, "device": "cpu", "progress": False, "mode": "grad",
           "loss": {"_target_": "hookrun.runner.losses.target_logit", "_partial_": True},
           "hooks": {"fmap": {"at": "layers.1", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
                     "g": {"at": "layers.1", "type": "tensor", "actions": ["record"]}},
           "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": N, "shape": [3, 56, 56],
                                "num_classes": 3, "seed": 7}, "batch_size": N},
           "output": {"path": str(tmp_path / "captures.h5")}}
    path = hookrun.run(cfg).path
    from hookrun.data import RandomTensors

    data = RandomTensors(n=N, shape=[3, 56, 56], num_classes=3, seed=7)
    x, y = torch.stack([data[i][0] for i in range(N)]), torch.tensor([int(data[i][1]) for i in range(N)])
    kept = {}
    h = model.layers[1].register_forward_hook(lambda mod, a, out: kept.update(a=out) or None)
    (g,) = torch.autograd.grad(model(x).gather(1, y.view(-1, 1)).sum(), [kept["a"]])
    h.remove()
    a, g = kept["a"].detach().double(), g.double()  # (N, H, W, C)
    assert a.shape[1] == a.shape[2] != a.shape[3]
    ref = torch.relu((g.mean(dim=(1, 2), keepdim=True) * a).sum(3)).numpy()
    ref = ref / np.maximum(ref.reshape(N, -1).max(1), 1e-30).reshape(-1, 1, 1)
    with hookrun.open_run(path) as run:
        (stem, spec), = plot_cam.pictures(run)
        drawn = []
        monkeypatch.setattr(gradcam_section, "overlay_png", lambda cam, picture, size=128: drawn.append(cam) or "")
        gradcam_section.gradcam(run)
    np.testing.assert_allclose(spec.maps, ref, atol=1e-5)
    np.testing.assert_allclose(np.stack(drawn), ref, atol=1e-5)


def test_pictures_of_a_swin_stages_maps_show_its_channels(tmp_path, monkeypatch):
    """plot's feature maps, the report's thumbnails and the latents' channel pictures took axis 1 of every
    4-D capture as the channels: of a Swin stage's (N, H, W, C) maps they drew H-rows as 'channels', each a
    (W, C) image. Reference: a raw forward hook's output, its channels on the last axis."""
    from hookrun.analysis.report import latents, run_sections
    from hookrun.cli import figures, plot_command

    model = swin_model()
    ckpt = tmp_path / "swin.pt"
    torch.save(model.state_dict(), ckpt)
    path = run(tmp_path, {**SWIN, "checkpoint": str(ckpt)}, "layers.1", {"raw": {}})
    a = raw_output(model, "layers.1")  # (N, 7, 7, 32)
    want = a.transpose(0, 3, 1, 2)  # (N, C, H, W)
    grids, thumbs = [], []
    monkeypatch.setattr(figures, "feature_grid", lambda rows, *args, **kw: grids.append(rows) or None)
    monkeypatch.setattr(figures, "save", lambda fig, out, **kw: out)
    monkeypatch.setattr(run_sections, "png", lambda m, lo, hi, **kw: thumbs.append(m) or "")
    with hookrun.open_run(path) as r:
        info = next(c for c in r.captures if c.module == "layers.1")
        plot_command.feature_maps(r, info, tmp_path, samples=2, channels=16)
        run_sections.thumbnails(r, info, run_sections.Budget())
        images = latents.ChannelImages(r, info, info)  # (its maps; the images are not read here)
        np.testing.assert_allclose(images.channel(3, 5), a[3, :, :, 5], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grids[0], want[:2, :16], rtol=1e-5, atol=1e-6)
    n = run_sections.Budget().samples
    np.testing.assert_allclose(np.stack(thumbs).reshape(-1, 16, 7, 7), want[:n, :16], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", [{"op": "add", "factor": 0.5}, {"op": "mask", "index": [0, 5]}])
def test_add_and_mask_at_a_swin_stage_act_on_its_channels_by_default(tmp_path, op):
    """op add (a vector) and op mask take the channels by default ("dim 1" before): at a Swin stage,
    (N, H, W, C), that was the height (a C-vector failed torch's view, or where H == C went along the
    height). Reference: a raw forward hook doing the same along the last axis; the logits compared."""
    model = swin_model()
    ckpt = tmp_path / "swin.pt"
    torch.save(model.state_dict(), ckpt)
    c = raw_output(model, "layers.1").shape[3]
    v = torch.linspace(-1, 1, c, dtype=torch.float64)
    params = {**op, "value": v.tolist()} if op["op"] == "add" else op
    cfg = {"model": {**SWIN, "checkpoint": str(ckpt)}, "device": "cpu", "progress": False,
           "hooks": {"m": {"at": "layers.1", "type": "forward", "actions": [{"name": "modify_output", **params}]},
                     "logits": {"at": "", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
           "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": N, "shape": [3, 56, 56],
                                "num_classes": 3, "seed": 7}, "batch_size": 2},
           "output": {"path": str(tmp_path / "captures.h5")}}
    path = hookrun.run(cfg).path

    def edit(mod, args, out):
        if op["op"] == "add":
            return out + (0.5 * v).to(out.dtype)
        out = out.clone()
        out[..., [0, 5]] = 0
        return out

    from hookrun.data import RandomTensors

    data = RandomTensors(n=N, shape=[3, 56, 56], num_classes=3, seed=7)
    h = model.layers[1].register_forward_hook(edit)
    with torch.no_grad():
        want = model(torch.stack([data[i][0] for i in range(N)])).numpy()
    h.remove()
    with h5py.File(path, "r") as f:
        np.testing.assert_allclose(f["captures/logits/__model__/output"][:], want, rtol=1e-5, atol=1e-5)
