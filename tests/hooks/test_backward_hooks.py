"""A full backward hook on a module whose output is then modified in place (ResNet's bn2 before
`out += identity`). Reference: torch.autograd.grad on the same model."""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pytest
import torch
from conftest import make_cfg, small_resnet
from kw_models import Scorer, Tokens

import hookrun
from hookrun.errors import RunError


def test_a_backward_hook_on_bn2_before_out_plus_identity_works(tmp_path, checkpoint, dataset):
    hooks = {"b": {"at": "layer1.0.bn2", "type": "backward", "actions": ["record"]}}
    cfg = make_cfg(tmp_path, checkpoint, hooks, mode="grad",
                   loss={"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True})
    path = hookrun.run(cfg).path
    model = small_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.eval()
    for m in model.modules():
        if getattr(m, "inplace", False):
            m.inplace = False
    seen = {}  # bn2's input and output as copies: the reference gradients are d(loss)/d(those)
    model.layer1[0].conv2.register_forward_hook(lambda m, i, o: seen.setdefault("in", []).append(o.clone()) or seen["in"][-1])
    model.layer1[0].bn2.register_forward_hook(lambda m, i, o: seen.setdefault("out", []).append(o.clone()) or seen["out"][-1])
    grads_in, grads_out = [], []
    for start in range(0, len(dataset), 4):
        seen.clear()
        x = torch.stack([dataset[i][0] for i in range(start, start + 4)])
        y = torch.stack([dataset[i][1] for i in range(start, start + 4)])
        loss = torch.nn.functional.cross_entropy(model(x.requires_grad_(True)), y)
        g_in, g_out = torch.autograd.grad(loss, [seen["in"][0], seen["out"][0]])
        grads_in.append(g_in)
        grads_out.append(g_out)
    with h5py.File(path) as f:
        assert f.attrs["status"] == "complete"
        np.testing.assert_allclose(f["captures/b/layer1.0.bn2/grad_output"][:], torch.cat(grads_out).numpy(), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(f["captures/b/layer1.0.bn2/grad_input"][:], torch.cat(grads_in).numpy(), rtol=1e-4, atol=1e-7)


class ThreeCalls(torch.nn.Module):
    """`lin` runs three times in one forward: on x, 2x and 3x."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return tuple(self.lin(k * x) for k in (1, 2, 3))


def detached_middle(ys):  # call 1 gets no gradient; calls 0 and 2 do
    return ys[0].pow(2).sum() + 3 * ys[2].sum() + ys[1].detach().sum()


def reference_calls(model, x, losses):
    """{call: (d loss / d input, d loss / d output)} of each `lin` call, by torch.autograd.grad on
    the calls made by hand; `losses(ys)` gives one loss per backward pass, each reaching one call."""
    xs = [k * x.clone().requires_grad_(True) for k in (1, 2, 3)]
    ys = [model.lin(a) for a in xs]
    return {call: torch.autograd.grad(loss, [xs[call], ys[call]], retain_graph=True) for call, loss in losses(ys)}


BOTH = {"b": {"at": "lin", "type": "backward", "actions": ["record"]},
        "p": {"at": "lin", "type": "backward_pre", "actions": ["record"]}}


def test_a_backward_hook_files_each_gradient_under_its_own_forward_call():
    """Call 1's output is detached, so only calls 0 and 2 get gradients: they were filed as calls 1
    and 2 (the count of backward firings taken from the count of forward calls)."""
    torch.manual_seed(0)
    model, x = ThreeCalls(), torch.randn(3, 4)
    with hookrun.capture(model, BOTH) as cap:
        detached_middle(model(x.clone().requires_grad_(True))).backward()
    want = reference_calls(model, x, lambda ys: [(0, detached_middle(ys)), (2, detached_middle(ys))])
    assert sorted(k for k in cap.keys() if k[0] == "b") == [("b", "lin", r) for r in
                                                             ("grad_input", "grad_input@2", "grad_output", "grad_output@2")]
    assert sorted(k for k in cap.keys() if k[0] == "p") == [("p", "lin", "grad_output"), ("p", "lin", "grad_output@2")]
    for call, at in ((0, ""), (2, "@2")):
        torch.testing.assert_close(cap["b", "lin", "grad_input" + at], want[call][0])
        torch.testing.assert_close(cap["b", "lin", "grad_output" + at], want[call][1])
        torch.testing.assert_close(cap["p", "lin", "grad_output" + at], want[call][1])


def test_gradients_that_come_back_out_of_call_order_keep_their_calls():
    """One backward per call, in the order 1, 0, 2: each firing is the call whose output it reached."""
    torch.manual_seed(0)
    model, x = ThreeCalls(), torch.randn(3, 4)

    def losses(ys):
        return [(1, (2 * ys[1]).pow(2).sum()), (0, ys[0].sum()), (2, (3 * ys[2]).sum())]

    with hookrun.capture(model, BOTH) as cap:
        for _, loss in losses(model(x.clone().requires_grad_(True))):
            loss.backward(retain_graph=True)
    want = reference_calls(model, x, losses)
    for call, at in ((0, ""), (1, "@1"), (2, "@2")):
        torch.testing.assert_close(cap["b", "lin", "grad_input" + at], want[call][0])
        torch.testing.assert_close(cap["b", "lin", "grad_output" + at], want[call][1])
        torch.testing.assert_close(cap["p", "lin", "grad_output" + at], want[call][1])


def kw_cfg(tmp_path, hooks) -> dict:
    return {"data": {"batch_size": 4}, "device": "cpu", "progress": False, "hooks": hooks, "mode": "grad",
            "loss": {"_target_": "hookrun.runner.losses.sum_output", "_partial_": True},
            "output": {"path": str(tmp_path / "c.h5"), "overwrite": True}}


class Wrap(torch.nn.Module):
    """`d` returns a dict; the model reads one key of it."""

    def __init__(self):
        super().__init__()
        self.d = Dict(4)

    def forward(self, x):
        return self.d(x)["a"]


class TokenWrap(Scorer):
    """Scorer (token items) with a dict-returning `d` in place of its `mix`."""

    def __init__(self):
        super().__init__()
        self.d = Dict(8)

    def forward(self, input_ids, attention_mask=None):
        return self.head(self.d(self.embed(input_ids))["a"].mean(1))


class Dict(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return {"a": self.lin(x)}


@pytest.mark.parametrize("kind", ["backward", "backward_pre"])
def test_a_backward_hook_on_a_module_returning_a_dict_is_refused_in_one_line(kind):
    """PyTorch's full backward hooks never fire on a dict output: the run ended complete with no
    capture, and a warning that the module did not run. Refused at its first call instead; the
    tensor hook it names records the gradient (reference: torch.autograd.grad)."""
    torch.manual_seed(0)
    model, x = Wrap(), torch.randn(2, 4, requires_grad=True)
    with pytest.raises(RunError, match=rf"^hooks.b: a {kind} hook on d never fires: .* d returns a dict \(output.a\); "
                                       r"use type: tensor on the same module \(.*grad.a for output.a\)") as err:
        with hookrun.capture(model, {"b": {"at": "d", "type": kind, "actions": ["record"]}}):
            model(x).sum().backward()
    assert "\n" not in str(err.value)
    with hookrun.capture(model, {"t": {"at": "d", "type": "tensor", "actions": ["record"]}}) as cap:
        model(x).pow(2).sum().backward()
    out = model.d(x)["a"]
    torch.testing.assert_close(cap["t", "d", "grad.a"], torch.autograd.grad(out.pow(2).sum(), out)[0])


def test_a_file_run_with_a_backward_hook_on_a_dict_output_stops_at_its_first_batch(tmp_path):
    """It ended `complete`, exit 0, with no capture and "module 'd' did not run"."""
    hooks = {"b": {"at": "d", "type": "backward", "actions": ["record"]}}
    with pytest.raises(RunError, match=r"^hooks.b: a backward hook on d never fires: .* d returns a dict \(output.a\)"):
        hookrun.run(kw_cfg(tmp_path, hooks), model=TokenWrap(), dataset=Tokens(n=8))


def test_modify_grad_where_grad_input_is_none_says_so_once(tmp_path, caplog):
    """An embedding's grad_input is None (its input is integer ids): modify_grad on a backward hook
    there changed nothing, silently. One warning naming the hook; the gradients are PyTorch's own
    (reference: the embedding's weight gradient of a plain backward)."""
    hooks = {"z": {"at": "embed", "type": "backward", "actions": [{"name": "modify_grad", "op": "zero"}]},
             "w": {"at": "embed.weight", "type": "param", "actions": ["record"]}}
    torch.manual_seed(0)
    model, ds = Scorer(), Tokens(n=8)
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        hookrun.run(kw_cfg(tmp_path, hooks), model=model, dataset=ds)
    said = [r.getMessage() for r in caplog.records if "no gradient to modify" in r.getMessage()]
    assert said == ["hooks.z.actions.0: modify_grad has no gradient to modify at embed: its grad_input is None (no input "
                    "of it needs a gradient: an embedding's input is integer ids), so nothing changes; modify its "
                    "grad_output (type: backward_pre, replace_input) or its output's gradient (type: tensor, modify_grad)"]
    want = []
    for i in range(0, 8, 4):
        model.zero_grad()
        model(ds.ids[i:i + 4], ds.mask[i:i + 4]).sum().backward()
        want.append(model.embed.weight.grad.clone())
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_allclose(f["captures/w/embed.weight/grad"][:], torch.stack(want).numpy(), rtol=1e-6, atol=1e-7)
