"""hookrun.capture: records, replacements and gradients against raw PyTorch on the same model and
inputs, and against a file run of the same config; no hook outlives the block."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import batches, make_cfg

import hookrun
from hookrun.errors import ConfigError, NotFoundError


def hook_count(model: torch.nn.Module) -> int:
    n = 0
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        n += len(m._backward_pre_hooks)
    return n + sum(len(p._backward_hooks or {}) for p in model.parameters())


def test_records_equal_raw_hooks_over_several_forwards(reference_model, dataset):
    model = reference_model
    seen = []
    h = model.layer1[0].register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
    xs = [x for x, _ in batches(dataset)]
    with torch.no_grad():
        for x in xs:
            model(x)
    h.remove()
    with torch.no_grad(), hookrun.capture(model, {"f": {"at": "layer1.*", "type": "forward", "actions": ["record"]}}) as cap:
        for x in xs:
            model(x)
    assert isinstance(cap["layer1.0", "output"], torch.Tensor)
    torch.testing.assert_close(cap["layer1.0", "output"], torch.cat(seen), rtol=0, atol=0)
    assert set(cap.keys()) == {("f", m, r) for m in ("layer1.0", "layer1.1") for r in ("input", "output")}
    assert cap["f/layer1.0/output"].shape == (len(dataset), 64, 8, 8)
    assert hook_count(model) == 0


def test_a_module_called_twice_keeps_its_calls_apart(reference_model, dataset):
    x, _ = next(batches(dataset))
    relu_out = []
    h = reference_model.layer1[0].relu.register_forward_hook(lambda m, a, out: relu_out.append(out.clone()))
    with torch.no_grad():
        reference_model(x)
        reference_model(x)
    h.remove()
    spec = {"r": {"at": "layer1.0.relu", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with torch.no_grad(), hookrun.capture(reference_model, spec) as cap:
        reference_model(x)
        reference_model(x)
    torch.testing.assert_close(cap["layer1.0.relu", "output"], torch.cat([relu_out[0], relu_out[2]]))
    torch.testing.assert_close(cap["layer1.0.relu", "output@1"], torch.cat([relu_out[1], relu_out[3]]))


def test_modify_output_intervenes_like_a_raw_hook(reference_model, dataset):
    x, _ = next(batches(dataset))
    h = reference_model.layer3.register_forward_hook(lambda m, a, out: out * 0.5)
    with torch.no_grad():
        want = reference_model(x)
    h.remove()
    spec = {"ablate": {"at": "layer3", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.5}]},
            "logits": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with torch.no_grad(), hookrun.capture(reference_model, spec) as cap:
        got = reference_model(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(cap["fc", "output"], want)
    with torch.no_grad():
        assert not torch.allclose(reference_model(x), want)  # the intervention ended with the block


def test_gradients_inside_the_block_equal_autograd(reference_model, dataset):
    x, y = next(batches(dataset))
    kept = {}
    h = reference_model.layer4.register_forward_hook(lambda m, a, out: kept.update(o=out) or None)
    loss = F.cross_entropy(reference_model(x), y)
    h.remove()
    want, want_w = torch.autograd.grad(loss, [kept["o"], reference_model.fc.weight])
    spec = {"g": {"at": "layer4", "type": "tensor", "actions": ["record"]},
            "w": {"at": "fc.weight", "type": "param", "actions": ["record"]}}
    with hookrun.capture(reference_model, spec) as cap:
        F.cross_entropy(reference_model(x), y).backward()
    reference_model.zero_grad(set_to_none=True)
    torch.testing.assert_close(cap["layer4", "grad"], want)
    torch.testing.assert_close(cap["fc.weight", "grad"], want_w[None])  # one row per step
    assert hook_count(reference_model) == 0


def test_every_hook_is_removed_after_an_exception(reference_model, dataset):
    x, _ = next(batches(dataset))
    spec = {"f": {"at": "**", "type": "forward"}, "b": {"at": "layer2", "type": "backward"},
            "p": {"at": "fc.bias", "type": "param"}}
    with pytest.raises(ZeroDivisionError), hookrun.capture(reference_model, spec) as cap:
        reference_model(x)
        raise ZeroDivisionError("in the block")
    assert ("f", "layer1.0", "output") in cap.keys()
    assert hook_count(reference_model) == 0
    with pytest.raises(NotFoundError, match="closest names: layer1"), hookrun.capture(reference_model, {"f": {"at": "layer1x", "type": "forward"}}):
        pass
    assert hook_count(reference_model) == 0


def test_bad_names_give_one_clear_error(reference_model, dataset):
    x, _ = next(batches(dataset))
    with torch.no_grad(), hookrun.capture(reference_model, {"f": {"at": "layer1.0", "type": "forward"}}) as cap:
        reference_model(x)
    with pytest.raises(NotFoundError, match="closest: f/layer1.0/output"):
        cap["layer1.0", "outptu"]
    with pytest.raises(ConfigError, match="hooks.f.type"):
        with hookrun.capture(reference_model, {"f": {"at": "fc", "type": "fwd"}}):
            pass


def test_values_equal_a_file_run_of_the_same_config(tmp_path, checkpoint, reference_model, dataset):
    hooks = {"noise": {"at": "conv1", "type": "forward_pre", "actions": [{"name": "replace_input", "op": "noise", "std": 0.3, "seed": 5}]},
             "feat": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output", "reduce": "mean", "dtype": "float16"}]},
             "logits": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    result = hookrun.run(make_cfg(tmp_path, checkpoint, hooks))
    with torch.no_grad(), hookrun.capture(reference_model, hooks) as cap:
        for x, _ in batches(dataset):
            reference_model(x)
    with h5py.File(result.path) as f:
        np.testing.assert_array_equal(cap["fc", "output"].numpy(), f["captures/logits/fc/output"][:])
        np.testing.assert_array_equal(cap["layer2", "output"].numpy(), f["captures/feat/layer2/output"][:])
    assert cap["layer2", "output"].dtype == torch.float16


def test_run_takes_live_objects_and_writes_what_capture_holds(tmp_path, reference_model, dataset):
    hooks = {"f": {"at": "layer1.0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    result = hookrun.run({"hooks": hooks, "data": {"batch_size": 5}, "device": "cpu", "progress": False,
                          "output": {"path": str(tmp_path / "live.h5")}}, model=reference_model, dataset=dataset)
    with torch.no_grad(), hookrun.capture(reference_model, hooks) as cap:
        reference_model(torch.stack([dataset[i][0] for i in range(len(dataset))]))
    with hookrun.open_run(result.path) as run:
        np.testing.assert_array_equal(run["layer1.0", "output"][:], cap["layer1.0", "output"].numpy())
        assert run.config["model"] == {"live": "torchvision.models.resnet.ResNet"}
        assert run.config["data"]["dataset"] == {"live": "hookrun.data.RandomTensors"}
    with pytest.raises(ConfigError, match=r"run\(model=...\): got a str, not a torch.nn.Module"):
        hookrun.run({"hooks": hooks, "output": {"path": str(tmp_path / "x.h5")}}, model="resnet", dataset=dataset)


def test_forwards_of_different_lengths_are_kept_apart():
    model = torch.nn.Linear(3, 2)
    with torch.no_grad(), hookrun.capture(model, {"f": {"at": "", "type": "forward"}}) as cap:
        model(torch.ones(2, 3))
        model(torch.ones(1, 4, 3))
    with pytest.raises(hookrun.errors.RunError, match="rows of different shapes"):
        cap["", "output"]
    assert [tuple(p.shape) for p in cap.parts("", "output")] == [(2, 2), (1, 4, 2)]
