"""Patching on an image model (issue 39 item 3): a random-weight torchvision ResNet-18 on 16x16 images,
clean and corrupted images as item keys, sites over `[channel]` or `[height, width]` of a convolutional
feature map; exact grids equal a one-cell-at-a-time loop of raw forward hooks and atp the estimate
made with torch.autograd.grad; a site or model that cannot be patched is one line before any cell."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

torchvision = pytest.importorskip("torchvision")
N, CLASSES = 3, 10


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=CLASSES)
    m.train()
    with torch.no_grad():  # batch-norm statistics taken on noise (random networks are too sensitive otherwise)
        for _ in range(4):
            m(torch.randn(16, 3, 16, 16))
    return m.eval()


@pytest.fixture(scope="module")
def plain(resnet):
    """The same network with its in-place operations out of place: the references' raw hooks then see each
    module's own output (an in-place ReLU or `out += identity` after a hooked module overwrites the tensor the hook returned)."""
    import copy
    import types

    def block_forward(self, x):  # torchvision's BasicBlock.forward with `out += identity` out of place
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + (self.downsample(x) if self.downsample is not None else x))

    m = copy.deepcopy(resnet)
    for mod in m.modules():
        if isinstance(mod, torch.nn.ReLU):
            mod.inplace = False
        if isinstance(mod, torchvision.models.resnet.BasicBlock):
            mod.forward = types.MethodType(block_forward, mod)
    return m


@pytest.fixture(scope="module")
def task():
    g = torch.Generator().manual_seed(1)
    clean, corrupt = torch.randn(N, 3, 16, 16, generator=g), torch.randn(N, 3, 16, 16, generator=g)
    ans, wrong = torch.tensor([1, 4, 7]), torch.tensor([2, 2, 0])
    items = [{"clean": clean[i], "corrupt": corrupt[i], "answer": ans[i], "wrong": wrong[i]} for i in range(N)]
    return clean, corrupt, ans, wrong, items


METRICS = {
    "logit": lambda lg, a, w: lg[torch.arange(N), a],
    "logprob": lambda lg, a, w: torch.log_softmax(lg.double(), -1)[torch.arange(N), a],
    "prob": lambda lg, a, w: torch.softmax(lg.double(), -1)[torch.arange(N), a],
    "logit_diff": lambda lg, a, w: lg[torch.arange(N), a] - lg[torch.arange(N), w],
}


def module(model, name):
    return dict(model.named_modules())[name]


def cells_of(shape, over):
    """Each cell's index over the (channel, height, width) axes, in C order of the `over` axes."""
    axes = {"channel": 0, "height": 1, "width": 2}
    sizes = [shape[axes[a]] for a in over]
    for flat in range(int(np.prod(sizes))):
        idx = [slice(None)] * 3
        for a, i in zip(over, np.unravel_index(flat, sizes), strict=True):
            idx[axes[a]] = int(i)
        yield tuple(idx)


def raw_loop(model, name, clean, corrupt, over, metric):
    """The metric of the corrupted run with one cell of `name`'s output from the clean run, one cell a forward."""
    m = module(model, name)
    with torch.no_grad():
        kept = {}
        h = m.register_forward_hook(lambda mod, a, o: kept.setdefault("x", o.detach().clone()))
        model(clean)
        h.remove()
        out = []
        for idx in cells_of(kept["x"].shape[1:], over):
            def patch(mod, a, o, idx=idx):
                o = o.clone()
                o[(slice(None), *idx)] = kept["x"][(slice(None), *idx)]
                return o
            h = m.register_forward_hook(patch)
            out.append(float(metric(model(corrupt)).double().mean()))
            h.remove()
    return np.array(out)


def raw_atp(model, name, clean, corrupt, over, metric):
    """metric(corrupt) + sum over each cell of (clean - corrupt) * d metric / d output, by torch.autograd.grad."""
    m = module(model, name)
    acts = {}
    h = m.register_forward_hook(lambda mod, a, o: acts.setdefault("clean", o.detach().clone()))
    with torch.no_grad():
        model(clean)
    h.remove()

    def keep(mod, a, o):  # a zero added to the output: its gradient is the output's (an in-place relu after it
        acts["corrupt"] = o.detach().clone()  # would change the output tensor itself)
        acts["delta"] = torch.zeros_like(o, requires_grad=True)
        return o + acts["delta"]
    h = m.register_forward_hook(keep)
    value = metric(model(corrupt)).double().mean()
    h.remove()
    (grad,) = torch.autograd.grad(value, [acts["delta"]])
    terms = ((acts["clean"] - acts["corrupt"]).double() * grad.double()).sum(0)
    return np.array([float(value) + float(terms[idx].sum()) for idx in cells_of(terms.shape, over)])


@pytest.mark.parametrize(("name", "over", "metric"), [
    ("layer1.0.conv2", ["channel"], "logit_diff"),
    ("layer2.1", ["height", "width"], "logprob"),
    ("layer1.0.bn1", ["height", "width"], "prob"),
    ("layer1.1.bn2", ["channel"], "logit"),
])
def test_exact_and_atp_equal_raw_hooks_on_a_resnet(resnet, plain, task, name, over, metric):
    clean, corrupt, ans, wrong, items = task
    fn = lambda lg: METRICS[metric](lg, ans, wrong)  # noqa: E731
    site = {"s": {"at": name, "over": over}}
    exact = hookrun.patch_grid(resnet, items, input="x", metric={"name": metric}, sites=site, cells_per_forward=16)["s"]
    assert exact.dims == ("module", *over)
    want = raw_loop(plain, name, clean, corrupt, over, fn)
    assert np.ptp(want) > 0
    np.testing.assert_allclose(exact.values.reshape(-1), want, rtol=1e-4, atol=1e-5)
    atp = hookrun.patch_grid(resnet, items, input="x", method="atp", metric={"name": metric}, sites=site)["s"]
    np.testing.assert_allclose(atp.values.reshape(-1), raw_atp(plain, name, clean, corrupt, over, fn), rtol=1e-4, atol=1e-5)
    assert not resnet.training and not any(m._forward_hooks for m in resnet.modules())


def test_a_patching_file_run_on_images(tmp_path, resnet, plain, task):
    clean, corrupt, ans, wrong, items = task
    cfg = {"progress": False, "output": {"path": str(tmp_path / "img.h5")},
           "patching": {"input": "x", "metric": {"name": "logit_diff", "normalize": True},
                        "sites": {"maps": {"at": "layer1.1", "over": ["height", "width"]}}}}
    hookrun.run(cfg, model=resnet, dataset=items)
    grid = hookrun.open_run(tmp_path / "img.h5").grid("maps")
    raw = raw_loop(plain, "layer1.1", clean, corrupt, ["height", "width"], lambda lg: METRICS["logit_diff"](lg, ans, wrong))
    with torch.no_grad():
        m_clean, m_corrupt = (float(METRICS["logit_diff"](resnet(x), ans, wrong).double().mean()) for x in (clean, corrupt))
    assert grid.dims == ("module", "height", "width") and grid.shape == (1, 4, 4)
    np.testing.assert_allclose(grid.values.reshape(-1), (raw - m_corrupt) / (m_clean - m_corrupt), atol=1e-4)


@pytest.mark.parametrize(("block", "message"), [
    ({"sites": {"s": {"at": "fc", "over": ["height"]}}}, r"patching.sites.s.over: 'height' is not an axis of fc's output"),
    ({"metric": {"name": "ce"}}, r"patching.metric.name='ce' reads the next token .* has no token axis"),
    ({"metric": {"name": "prob", "answer": "big"}}, r"patching.metric.answer='big': item 0 has id 10, outside the model's 10"),
    ({"input": "images"}, r"patching.input='images' is not an argument of ResNet.forward, which takes x"),
])
def test_what_cannot_be_patched_is_one_line(resnet, task, block, message):
    *_, items = task
    items = [{**it, "big": torch.tensor(10)} for it in items]
    block = {"input": "x", "sites": {"s": {"at": "layer1", "over": ["channel"]}}, **block}
    with pytest.raises(ConfigError, match=message):
        hookrun.patch_grid(resnet, items, **block)
    assert not any(m._forward_hooks for m in resnet.modules())


def test_a_vit_token_axis_is_a_position(task):
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                            num_classes=CLASSES).eval()
    clean, corrupt, ans, wrong, items = task
    g = hookrun.patch_grid(vit, items, input="x", sites={"t": {"at": "encoder.layers.*", "over": ["position"]}})["t"]
    assert g.dims == ("module", "position") and g.shape == (2, 17)  # the class token and 16 patches
    layer = vit.encoder.layers[1]
    with torch.no_grad():  # the reference: one token of block 1's output from the clean run, one token a forward
        kept = {}
        h = layer.register_forward_hook(lambda mod, a, o: kept.setdefault("x", o.clone()))
        vit(clean)
        h.remove()
        ref = []
        for p in range(17):
            def patch(mod, a, o, p=p):
                o = o.clone()
                o[:, p] = kept["x"][:, p]
                return o
            h = layer.register_forward_hook(patch)
            ref.append(float(METRICS["logit_diff"](vit(corrupt), ans, wrong).double().mean()))
            h.remove()
    np.testing.assert_allclose(g.values[1], ref, atol=1e-5)
