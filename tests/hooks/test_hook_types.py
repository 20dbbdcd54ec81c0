"""One test per hook type: recorded values against raw PyTorch on the same weights and inputs."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from conftest import batches

GRAD = {"mode": "grad", "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}}


def raw_forward(model, dataset, module_name):
    """(inputs, outputs) of `module_name` from a plain register_forward_hook, cloned."""
    module = dict(model.named_modules())[module_name]
    seen_in, seen_out = [], []

    def keep(m, args, out):
        seen_in.append(args[0].detach().clone())
        seen_out.append(out.detach().clone())

    handle = module.register_forward_hook(keep)
    with torch.no_grad():
        for x, _ in batches(dataset):
            model(x)
    handle.remove()
    return torch.cat(seen_in).numpy(), torch.cat(seen_out).numpy()


def autograd_grads(model, dataset, module_name):
    """d(loss)/d(input) and d(loss)/d(output) of `module_name` via torch.autograd.grad."""
    module = dict(model.named_modules())[module_name]
    grads_in, grads_out = [], []
    for x, y in batches(dataset):
        kept = {}
        h = module.register_forward_hook(lambda m, args, out, kept=kept: kept.update(i=args[0], o=out) or None)
        x = x.clone().requires_grad_(True)
        loss = F.cross_entropy(model(x), y)
        h.remove()
        gi, go = torch.autograd.grad(loss, [kept["i"], kept["o"]])
        grads_in.append(gi)
        grads_out.append(go)
    return torch.cat(grads_in).numpy(), torch.cat(grads_out).numpy()


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_forward_records_input_and_output(run_hooks, reference_model, dataset):
    f = run_hooks({"fmap": {"at": "layer2.1.conv2", "type": "forward", "actions": ["record"]}})
    want_in, want_out = raw_forward(reference_model, dataset, "layer2.1.conv2")
    group = f["captures/fmap/layer2.1.conv2"]
    close(group["output"][:], want_out)
    close(group["input"][:], want_in)
    assert group["output"].attrs["role"] == "output" and group["output"].attrs["type"] == "forward"
    np.testing.assert_array_equal(f["samples/index"][:], np.arange(len(dataset)))
    np.testing.assert_array_equal(f["samples/target"][:], dataset.y.numpy())


def test_forward_pre_records_what_the_module_receives(run_hooks, reference_model, dataset):
    f = run_hooks({"x": {"at": "fc", "type": "forward_pre", "actions": ["record"]}})
    m = reference_model
    with torch.no_grad():  # the submodules called directly, not through a hook
        want = torch.cat([torch.flatten(m.avgpool(m.layer4(m.layer3(m.layer2(m.layer1(
            m.maxpool(m.relu(m.bn1(m.conv1(x))))))))), 1) for x, _ in batches(dataset)])
    close(f["captures/x/fc/input"][:], want.numpy())


def test_backward_records_grad_input_and_grad_output(run_hooks, reference_model, dataset):
    f = run_hooks({"g": {"at": "layer4", "type": "backward", "actions": ["record"]}}, **GRAD)
    want_in, want_out = autograd_grads(reference_model, dataset, "layer4")
    close(f["captures/g/layer4/grad_input"][:], want_in)
    close(f["captures/g/layer4/grad_output"][:], want_out)


def test_backward_pre_records_grad_output(run_hooks, reference_model, dataset):
    f = run_hooks({"g": {"at": "layer3", "type": "backward_pre", "actions": ["record"]}}, **GRAD)
    _, want_out = autograd_grads(reference_model, dataset, "layer3")
    close(f["captures/g/layer3/grad_output"][:], want_out)


def test_tensor_hook_records_gradient_of_intermediate_output(run_hooks, reference_model, dataset):
    f = run_hooks({"t": {"at": "layer2", "type": "tensor", "actions": ["record"]}}, **GRAD)
    _, want = autograd_grads(reference_model, dataset, "layer2")
    close(f["captures/t/layer2/grad"][:], want)


def test_backward_on_whole_model_gives_gradient_wrt_input(run_hooks, reference_model, dataset):
    f = run_hooks({"g": {"at": "", "type": "backward", "actions": [{"name": "record", "what": "grad_input"}]}}, **GRAD)
    want = []
    for x, y in batches(dataset):
        x = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(reference_model(x), y), [x])
        want.append(g)
    close(f["captures/g/__model__/grad_input"][:], torch.cat(want).numpy())
    assert "grad_output" not in f["captures/g/__model__"]


def test_param_hook_records_one_row_per_step(run_hooks, reference_model, dataset):
    f = run_hooks({"w": {"at": ["fc.weight", "conv1.weight"], "type": "param", "actions": ["record"]}}, **GRAD)
    fc, conv = [], []
    for x, y in batches(dataset):
        gw, gc = torch.autograd.grad(F.cross_entropy(reference_model(x), y), [reference_model.fc.weight, reference_model.conv1.weight])
        fc.append(gw)
        conv.append(gc)
    ds = f["captures/w/fc.weight/grad"]
    assert ds.shape == (3, *reference_model.fc.weight.shape) and ds.attrs["rows"] == "steps"
    close(ds[:], torch.stack(fc).numpy())
    close(f["captures/w/conv1.weight/grad"][:], torch.stack(conv).numpy())


def test_snapshot_is_not_changed_by_a_later_inplace_op(run_hooks, reference_model, dataset):
    # bn1's output is overwritten by ReLU(inplace=True) right after the hook fires
    f = run_hooks({"bn": {"at": "bn1", "type": "forward", "actions": [{"name": "record", "what": "output"}]}})
    m = reference_model
    with torch.no_grad():
        want = torch.cat([m.bn1(m.conv1(x)) for x, _ in batches(dataset)]).numpy()
    got = f["captures/bn/bn1/output"][:]
    assert (got < 0).any(), "the recorded bn1 output was clamped by the in-place ReLU"
    close(got, want)


def test_module_called_twice_records_each_call(run_hooks, reference_model, dataset):
    f = run_hooks({"r": {"at": "layer1.0.relu", "type": "forward", "actions": [{"name": "record", "what": "output"}]}})
    m = reference_model
    first, second = [], []
    with torch.no_grad():
        for x, _ in batches(dataset):
            h = m.maxpool(m.relu(m.bn1(m.conv1(x))))
            b = m.layer1[0]
            first.append(F.relu(b.bn1(b.conv1(h))))
            second.append(b(h))  # the block's output is its second ReLU call
    group = f["captures/r/layer1.0.relu"]
    close(group["output"][:], torch.cat(first).numpy())
    close(group["output@1"][:], torch.cat(second).numpy())
    assert group["output"].attrs["call"] == 0 and group["output@1"].attrs["call"] == 1


def test_backward_call_index_matches_forward_call(run_hooks, reference_model, dataset):
    f = run_hooks({"r": {"at": "layer1.0.relu", "type": "backward", "actions": [{"name": "record", "what": "grad_output"}]}}, **GRAD)
    m, b = reference_model, reference_model.layer1[0]
    first, second = [], []
    for x, y in batches(dataset):
        kept = []
        h = b.relu.register_forward_hook(lambda mod, a, out, kept=kept: kept.append(out) or None)
        b.relu.inplace = False
        loss = F.cross_entropy(m(x), y)
        h.remove()
        g0, g1 = torch.autograd.grad(loss, kept)
        first.append(g0)
        second.append(g1)
    close(f["captures/r/layer1.0.relu/grad_output"][:], torch.cat(first).numpy())
    close(f["captures/r/layer1.0.relu/grad_output@1"][:], torch.cat(second).numpy())


def test_a_forward_hooks_input_is_the_input_before_an_in_place_module_changed_it(tmp_path):
    """ReLU(inplace=True) rectifies its input in place: a forward hook's `input` was the rectified
    tensor (equal to the output). It is the input as it came in, at each of the module's calls;
    reference: a raw forward pre-hook's clone. A module that changes its input in place without
    saying so (no `inplace`) is refused in one line, never recorded as it left."""
    import pytest

    import hookrun
    from hookrun.errors import RunError

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.act = torch.nn.Linear(4, 4), torch.nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.lin(self.act(self.lin(x) - 0.1)))  # (act called twice)

    class Sneaky(torch.nn.Module):
        def forward(self, x):
            return x.mul_(2.0)

    torch.manual_seed(0)
    model, data = Block().eval(), [(torch.randn(4), 0) for _ in range(6)]
    seen = []
    handle = model.act.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    with torch.no_grad():
        for s in range(0, 6, 3):
            model(torch.stack([x for x, _ in data[s:s + 3]]))
    handle.remove()
    hooks = {"r": {"at": "act", "type": "forward", "actions": [{"name": "record", "what": ["input", "output"]}]}}
    path = hookrun.run({"hooks": hooks, "data": {"batch_size": 3}, "progress": False,
                        "output": {"path": str(tmp_path / "a.h5")}}, model=model, dataset=data).path
    with hookrun.open_run(path) as run:
        for call in (0, 1):
            got = run["r", "act", "input@1" if call else "input"][()]
            want = torch.cat(seen[call::2]).numpy()
            np.testing.assert_array_equal(got, want)
            assert (want < 0).any()
        np.testing.assert_array_equal(run["r/act/input@1"][()], run["r", "act", "input@1"][()])  # (the label as listed)
    sneaky = torch.nn.Sequential(torch.nn.Linear(4, 4), Sneaky()).eval()
    hooks = {"r": {"at": "1", "type": "forward", "actions": [{"name": "record", "what": "input"}]}}
    with pytest.raises(RunError, match=r"^hooks\.r: 1 changed its input in place during its forward.*type: forward_pre"):
        hookrun.run({"hooks": hooks, "data": {"batch_size": 3}, "progress": False,
                     "output": {"path": str(tmp_path / "b.h5")}}, model=sneaky, dataset=data)
