"""Attribution runs (issue 39): each method's file rows equal captum 0.9's classes (zennit's Gradient with
its composite for lrp) called by hand on the same weights and batches; the model comes back as it went in."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torchvision

import hookrun
from hookrun.errors import ConfigError

captum_attr = pytest.importorskip("captum.attr")
zennit = pytest.importorskip("zennit")

N, B, CLASSES, SHAPE = 8, 4, 10, (3, 16, 16)  # 16 x 16: layer3's maps are 2 x 2, layer4's 1 x 1


def noise_bn(model: torch.nn.Module, shape=(3, 32, 32)) -> torch.nn.Module:
    """Batch-norm statistics taken on uniform noise (a random ResNet is then insensitive to batch size)."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None  # a cumulative average
    model.train()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(4):
            model(torch.rand(16, *shape, generator=g))
    return model.eval()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return noise_bn(torchvision.models.resnet18(weights=None, num_classes=CLASSES), SHAPE)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(N, *SHAPE, generator=g)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    return [(x[i], int(y[i])) for i in range(N)]


def run(tmp_path, model, data, **block):
    path = tmp_path / f"{block['method']}.h5"
    cfg = {"data": {"batch_size": B}, "device": "cpu", "progress": False, "output": {"path": str(path)}, "attribution": block}
    hookrun.run(cfg, model=model, dataset=data)
    return hookrun.open_run(path).attribution()


def batches(data):
    for s in range(0, N, B):
        xs, ys = zip(*data[s: s + B], strict=True)
        yield torch.stack(xs), torch.tensor(ys)


def reference(make, data, **kw):
    """captum's attribute, batch by batch as the run batches (target: each item's label)."""
    out, deltas = [], []
    for x, y in batches(data):
        r = make().attribute(x.clone(), target=y, **kw)
        if isinstance(r, tuple):
            r, d = r
            deltas.append(d.detach())
        out.append(r.detach())
    return torch.cat(out).numpy(), (torch.cat(deltas).numpy() if deltas else None)


def close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("block, make, kw", [
    ({"method": "saliency"}, lambda m: captum_attr.Saliency(m), {}),
    ({"method": "input_x_gradient"}, lambda m: captum_attr.InputXGradient(m), {}),
    ({"method": "integrated_gradients", "steps": 8},
     lambda m: captum_attr.IntegratedGradients(m), {"n_steps": 8, "return_convergence_delta": True}),
    ({"method": "integrated_gradients", "steps": 6, "rule": "riemann_trapezoid"},
     lambda m: captum_attr.IntegratedGradients(m), {"n_steps": 6, "method": "riemann_trapezoid", "return_convergence_delta": True}),
    ({"method": "occlusion", "window": [3, 8, 8], "strides": [3, 4, 4]},
     lambda m: captum_attr.Occlusion(m), {"sliding_window_shapes": (3, 8, 8), "strides": (3, 4, 4)}),
    ({"method": "grad_cam", "at": "layer3"}, lambda m: captum_attr.LayerGradCam(m, m.layer3), {}),
    ({"method": "grad_cam", "at": "layer2.1", "relu": True},
     lambda m: captum_attr.LayerGradCam(m, m.layer2[1]), {"relu_attributions": True}),
    ({"method": "integrated_gradients", "at": "layer1.1.conv2", "steps": 4},
     lambda m: captum_attr.LayerIntegratedGradients(m, m.layer1[1].conv2), {"n_steps": 4, "return_convergence_delta": True}),
    ({"method": "input_x_gradient", "at": "layer1.1.conv2"},
     lambda m: captum_attr.LayerGradientXActivation(m, m.layer1[1].conv2), {}),
], ids=["saliency", "input_x_gradient", "ig", "ig_trapezoid", "occlusion", "grad_cam", "grad_cam_relu", "layer_ig",
        "layer_x_activation"])
def test_each_method_equals_captum(tmp_path, model, data, block, make, kw):
    got = run(tmp_path, model, data, **block)
    want, delta = reference(lambda: make(model), data, **kw)
    assert got.shape == want.shape and got.dims[0] == "sample"
    assert got.dims == (("sample", "channel", "height", "width"))
    close(got.values, want)
    np.testing.assert_array_equal(got["target"].values, [y for _, y in data])
    if delta is not None:
        close(got["delta"].values, delta)
    else:
        assert "delta" not in got.coords
    with torch.no_grad():  # the model's own logit and probability for the target
        logits = model(torch.stack([x for x, _ in data]))
    t = torch.tensor([y for _, y in data])
    close(got["logit"].values, logits[torch.arange(N), t].numpy())
    close(got["prob"].values, torch.softmax(logits.double(), 1)[torch.arange(N), t].numpy())


def test_lrp_equals_zennit_and_the_model_comes_back_as_it_went_in(tmp_path, model, data):
    from zennit.attribution import Gradient
    from zennit.composites import EpsilonAlpha2Beta1Flat
    from zennit.torchvision import ResNetCanonizer

    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = [n for n, _ in model.named_parameters()]
    got = run(tmp_path, model, data, method="lrp", composite="epsilon_alpha2_beta1_flat")
    assert [n for n, _ in model.named_parameters()] == params  # no `bias` left behind by the canonizer
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    ref_model = copy.deepcopy(model)
    want = []
    for x, y in batches(data):
        composite = EpsilonAlpha2Beta1Flat(canonizers=[ResNetCanonizer()])
        with Gradient(model=ref_model, composite=composite) as attributor:
            _, rel = attributor(x, torch.eye(CLASSES)[y])
        want.append(rel)
    close(got.values, torch.cat(want).numpy())


LOW, HIGH = [-0.1, 0.0, -0.2], [1.0, 1.1, 0.9]  # epsilon_gamma_box's box: one bound per channel


def zennit_reference(model, data, name, **kw):
    """zennit's Gradient with the composite (and the ResNet's canonizer) on a copy of the model, batch by batch."""
    from zennit.attribution import Gradient
    from zennit.composites import COMPOSITES
    from zennit.torchvision import ResNetCanonizer

    ref_model, want = copy.deepcopy(model), []
    for x, y in batches(data):
        with Gradient(model=ref_model, composite=COMPOSITES[name](canonizers=[ResNetCanonizer()], **kw)) as attributor:
            _, rel = attributor(x, torch.eye(CLASSES)[y])
        want.append(rel)
    return torch.cat(want).numpy()


@pytest.mark.parametrize("name", sorted(pytest.importorskip("zennit.composites").COMPOSITES))
def test_every_zennit_composite_equals_zennit(model, data, name):
    if name == "beta_smooth":  # its ReLU rule keeps an input, and a BasicBlock calls its relu twice: refused
        with pytest.raises(ConfigError, match=r"^attribution.method=lrp: layer1.0.relu runs 2 times in one forward"):
            hookrun.attribute(model, data, batch_size=B, method="lrp", composite=name)
        return  # (tests/attribution/test_lrp_shared_modules.py: beta_smooth where each ReLU runs once)
    box = name == "epsilon_gamma_box"
    got = hookrun.attribute(model, data, batch_size=B, method="lrp", composite=name,
                            **({"low": LOW, "high": HIGH} if box else {}))["attribution"]
    kw = {"low": torch.tensor(LOW).view(1, 3, 1, 1), "high": torch.tensor(HIGH).view(1, 3, 1, 1)} if box else {}
    close(got, zennit_reference(model, data, name, **kw))  # zennit's own shape for per-channel bounds: (1, C, 1, 1)
    if box:  # the box's bounds are used: others give another map
        other = hookrun.attribute(model, data, batch_size=B, method="lrp", composite=name, low=0, high=1)["attribution"]
        assert not np.allclose(other, got, rtol=1e-3, atol=1e-3 * float(np.abs(got).max()))


def test_epsilon_gamma_box_on_normalized_images_takes_each_channels_bounds(tmp_path, model, data):
    """Images in [0, 1] normalized per channel: the box is (0 - mean) / std to (1 - mean) / std, per channel,
    given in YAML as lists (a file run); zennit takes it as (1, 3, 1, 1) tensors."""
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    normed = [((x - mean[:, None, None]) / std[:, None, None], y) for x, y in data]
    low, high = (-mean / std).tolist(), ((1 - mean) / std).tolist()
    got = run(tmp_path, model, normed, method="lrp", composite="epsilon_gamma_box", low=low, high=high)
    want = zennit_reference(model, normed, "epsilon_gamma_box", low=(-mean / std).view(1, 3, 1, 1),
                            high=((1 - mean) / std).view(1, 3, 1, 1))
    close(got.values, want)
    one = zennit_reference(model, normed, "epsilon_gamma_box", low=min(low), high=max(high))  # one box for all channels
    assert not np.allclose(one, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))


def test_targets_predicted_a_class_and_an_item_key(tmp_path, model, data):
    with torch.no_grad():
        predicted = model(torch.stack([x for x, _ in data])).argmax(1).numpy()
    got = run(tmp_path, model, data, method="saliency", target="predicted")
    np.testing.assert_array_equal(got["target"].values, predicted)
    got = run(tmp_path / "c", model, data, method="saliency", target=3)
    np.testing.assert_array_equal(got["target"].values, [3] * N)
    items = [{"x": x, "label": y, "other": (y + 1) % CLASSES} for x, y in data]
    path = tmp_path / "key.h5"
    hookrun.run({"data": {"batch_size": B, "inputs": ["x"]}, "device": "cpu", "progress": False, "output": {"path": str(path)},
                 "attribution": {"method": "saliency", "target": "other"}}, model=model, dataset=items)
    got = hookrun.open_run(path).attribution()
    want, _ = reference(lambda: captum_attr.Saliency(model), [(x, (y + 1) % CLASSES) for x, y in data])
    np.testing.assert_array_equal(got["target"].values, [(y + 1) % CLASSES for _, y in data])
    close(got.values, want)


def test_baselines_mean_and_blur_equal_captum_with_them(tmp_path, model, data):
    from torchvision.transforms.functional import gaussian_blur

    mean = np.mean(np.stack([x.numpy() for x, _ in data]).astype(np.float64), axis=0)
    got = run(tmp_path, model, data, method="occlusion", window=[3, 8, 8], baseline="mean")
    want, _ = reference(lambda: captum_attr.Occlusion(model), data, sliding_window_shapes=(3, 8, 8),
                        strides=(3, 8, 8), baselines=torch.tensor(mean, dtype=torch.float32)[None])
    close(got.values, want)
    got = run(tmp_path / "b", model, data, method="integrated_gradients", steps=4, baseline="blur", sigma=2.0)
    out = []
    for x, y in batches(data):
        out.append(captum_attr.IntegratedGradients(model).attribute(
            x, baselines=gaussian_blur(x, [13, 13], [2.0, 2.0]), target=y, n_steps=4).detach())
    close(got.values, torch.cat(out).numpy())


def test_notebook_attribute_returns_the_arrays(model, data):
    rows = hookrun.attribute(model, data, batch_size=B, method="integrated_gradients", steps=4)
    want, delta = reference(lambda: captum_attr.IntegratedGradients(model), data, n_steps=4, return_convergence_delta=True)
    close(rows["attribution"], want)
    close(rows["delta"], delta)
    assert model.training is False and set(rows) == {"attribution", "target", "logit", "prob", "delta"}


def test_resnet50_layer1_1_conv2_equals_captum_layer_classes(tmp_path):
    torch.manual_seed(2)
    m = noise_bn(torchvision.models.resnet50(weights=None, num_classes=CLASSES))
    g = torch.Generator().manual_seed(3)
    items = [(torch.rand(3, 32, 32, generator=g), i % CLASSES) for i in range(B)]
    x, y = torch.stack([i[0] for i in items]), torch.tensor([i[1] for i in items])
    layer = m.layer1[1].conv2
    for block, ref in [
        ({"method": "integrated_gradients", "steps": 4},
         lambda: captum_attr.LayerIntegratedGradients(m, layer).attribute(x, target=y, n_steps=4)),
        ({"method": "input_x_gradient"}, lambda: captum_attr.LayerGradientXActivation(m, layer).attribute(x, target=y)),
    ]:
        path = tmp_path / f"{block['method']}.h5"
        hookrun.run({"data": {"batch_size": B}, "device": "cpu", "progress": False, "output": {"path": str(path)},
                     "attribution": {**block, "at": "layer1.1.conv2"}}, model=m, dataset=items)
        got = hookrun.open_run(path).attribution()
        assert got.dims == ("sample", "channel", "height", "width") and got.shape == (B, 64, 8, 8)
        close(got.values, ref().detach().numpy())
