"""Interventions against a raw PyTorch hook that returns the replacement on the same model."""

from __future__ import annotations

import re

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import CLASSES, SHAPE, N, batches, make_cfg, small_resnet

import hookrun
from hookrun.data import RandomTensors
from hookrun.errors import ConfigError, RunError

GRAD = {"mode": "grad", "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}}
LOGITS = {"logits": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


def reference_logits(model, dataset, module_name, replace):
    """Logits with a raw forward hook on `module_name` returning replace(output)."""
    module = dict(model.named_modules())[module_name]
    handle = module.register_forward_hook(lambda m, args, out: replace(out))
    with torch.no_grad():
        out = torch.cat([model(x) for x, _ in batches(dataset)])
    handle.remove()
    return out.numpy()


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op, reference", [
    ({"op": "zero"}, lambda y: torch.zeros_like(y)),
    ({"op": "scale", "factor": 0.5}, lambda y: 0.5 * y),
    ({"op": "add", "value": 0.25}, lambda y: y + 0.25),
    ({"op": "add", "value": [float(i) / 128 for i in range(128)]},
     lambda y: y + (torch.arange(128, dtype=y.dtype) / 128).view(1, 128, 1, 1)),
    ({"op": "clamp", "min": -0.1, "max": 0.2}, lambda y: torch.clamp(y, -0.1, 0.2)),
    ({"op": "mask", "dim": 1, "index": [0, 5, 7]}, lambda y: y * (~torch.isin(torch.arange(128), torch.tensor([0, 5, 7]))).view(1, 128, 1, 1)),
    ({"op": "mean"}, lambda y: y.mean(0, keepdim=True).expand_as(y)),
    ({"op": "constant", "value": 1.5}, lambda y: torch.full_like(y, 1.5)),
], ids=["zero", "scale", "add", "add-vector", "clamp", "mask", "mean", "constant"])
def test_modify_output_ops_match_a_raw_hook(run_hooks, reference_model, dataset, op, reference):
    hooks = {"z": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", **op}]}, **LOGITS}
    f = run_hooks(hooks)
    close(f["captures/logits/fc/output"][:], reference_logits(reference_model, dataset, "layer2", reference))


def test_record_before_and_after_a_modify(run_hooks, reference_model, dataset):
    actions = [{"name": "record", "what": "output"}, {"name": "modify_output", "op": "scale", "factor": 3.0}, {"name": "record", "what": "output"}]
    f = run_hooks({"z": {"at": "layer2", "type": "forward", "actions": actions}})
    g = f["captures/z/layer2"]
    m = reference_model
    with torch.no_grad():
        want = torch.cat([m.layer2(m.layer1(m.maxpool(m.relu(m.bn1(m.conv1(x)))))) for x, _ in batches(dataset)]).numpy()
    close(g["output"][:], want)  # the first record sees the original
    close(g["output@1"][:], 3 * want)  # the second sees the modified output (kept as a second capture)


def test_record_before_and_after_a_modify_of_a_module_run_twice_is_one_line(run_hooks):
    """layer1.0.relu runs twice a forward: call 0's two records took output and output@1, and call 1's
    first record took output@2, so the file named the edited call 0 'output@1' (the second call, as
    docs/format.md reads it) and op: patch put it into call 1. Two hooks keep them apart."""
    actions = [{"name": "record", "what": "output"}, {"name": "modify_output", "op": "scale", "factor": 2.0},
               {"name": "record", "what": "output"}]
    with pytest.raises(RunError, match=r"^hooks\.z: layer1\.0\.relu runs more than once in a forward, and the hook "
                                       r"records its output twice in one call \(before and after an edit\): call 1 and "
                                       r"the repeat of an earlier call would both be output@1; record the edited value "
                                       r"in a hook of its own$"):
        run_hooks({"z": {"at": "layer1.0.relu", "type": "forward", "actions": actions}})


def test_user_op_gets_ctx_with_sample_indices(run_hooks, reference_model, dataset):
    hooks = {"shift": {"at": "layer2", "type": "forward", "actions": [
        {"name": "modify_output", "op": {"_target_": "toy_models.shift_by_sample_index", "_partial_": True}}]}, **LOGITS}
    f = run_hooks(hooks)
    state = {"i": 0}

    def shift(y):
        idx = torch.arange(state["i"], state["i"] + y.shape[0], dtype=y.dtype)
        state["i"] += y.shape[0]
        return y + idx.view(-1, 1, 1, 1)

    close(f["captures/logits/fc/output"][:], reference_logits(reference_model, dataset, "layer2", shift))


def test_noise_is_deterministic_and_independent_of_batch_size(run_hooks, tmp_path, dataset):
    def noisy(seed, **over):
        hooks = {"n": {"at": "conv1", "type": "forward_pre", "actions": [
            {"name": "replace_input", "op": "noise", "std": 0.3, "seed": seed}, "record"]}}
        path = str(tmp_path / f"noise_{seed}_{len(over)}.h5")
        return run_hooks(hooks, **{"output.path": path, **over})["captures/n/conv1/input"][:]

    a = noisy(5)
    np.testing.assert_array_equal(a, noisy(5, **{"data.batch_size": 6}))
    clean = torch.stack([dataset[i][0] for i in range(len(dataset))]).numpy()
    delta = a - clean
    assert abs(delta.mean()) < 0.01 and abs(delta.std() - 0.3) < 0.01
    assert not np.allclose(noisy(6), a)


def test_replace_input_arg_picks_one_positional_input(tmp_path):
    cfg = make_cfg(tmp_path, "", {"j": {"at": "join", "type": "forward_pre", "actions": [
        {"name": "replace_input", "op": "zero", "arg": 1}]}, "out": {"at": "join", "type": "forward", "actions": [{"name": "record", "what": "output"}]}})
    cfg["model"] = {"_target_": "toy_models.TwoInputs"}
    cfg["data"]["dataset"] = {"_target_": "toy_models.SignedRows"}
    torch.manual_seed(0)
    from toy_models import SignedRows, TwoInputs
    ref = TwoInputs()
    with h5py.File(hookrun.run(cfg).path) as f:
        got = f["captures/out/join/output"][:]
    with torch.no_grad():
        want = ref.lin(torch.stack([SignedRows()[i][0] for i in range(12)]))  # join(h, 0) == h
    close(got, want.numpy())


def param_grads(model, dataset, names, hook=None):
    """Per-step parameter gradients by torch.autograd.grad, optionally with a raw hook installed."""
    params = dict(model.named_parameters())
    handle = hook(model) if hook else None
    out = {n: [] for n in names}
    for x, y in batches(dataset):
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), [params[n] for n in names])
        for n, g in zip(names, grads, strict=True):
            out[n].append(g)
    if handle:
        handle.remove()
    return {n: torch.stack(v).numpy() for n, v in out.items()}


PARAMS = ["conv1.weight", "layer1.0.conv1.weight", "layer2.0.conv1.weight", "layer3.0.conv1.weight", "fc.weight"]
RECORD_PARAMS = {"w": {"at": PARAMS, "type": "param", "actions": ["record"]}}


def test_zeroing_grad_input_zeroes_upstream_and_keeps_downstream(run_hooks, reference_model, dataset):
    hooks = {"g": {"at": "layer2", "type": "backward", "actions": [{"name": "modify_grad", "op": "zero"}]}, **RECORD_PARAMS}
    f = run_hooks(hooks, **GRAD)
    plain = param_grads(reference_model, dataset, PARAMS)
    for name in ("conv1.weight", "layer1.0.conv1.weight"):  # upstream of layer2's input
        assert not f[f"captures/w/{name}/grad"][:].any()
        assert np.abs(plain[name]).sum() > 0
    for name in ("layer2.0.conv1.weight", "layer3.0.conv1.weight", "fc.weight"):
        close(f[f"captures/w/{name}/grad"][:], plain[name])


def test_scaling_a_tensor_gradient_scales_everything_upstream(run_hooks, reference_model, dataset):
    hooks = {"t": {"at": "layer3", "type": "tensor", "actions": [{"name": "modify_grad", "op": "scale", "factor": 2.0}]}, **RECORD_PARAMS}
    f = run_hooks(hooks, **GRAD)

    def raw(model):  # the same surgery by hand: a Tensor.register_hook on layer3's output
        return model.layer3.register_forward_hook(lambda m, a, out: out.register_hook(lambda g: 2 * g) and None)

    want = param_grads(reference_model, dataset, PARAMS, raw)
    plain = param_grads(reference_model, dataset, PARAMS)
    for name in PARAMS:
        close(f[f"captures/w/{name}/grad"][:], want[name])
    close(want["conv1.weight"], 2 * plain["conv1.weight"])
    close(want["fc.weight"], plain["fc.weight"])


def test_backward_pre_replace_input_replaces_grad_output(run_hooks, reference_model, dataset):
    hooks = {"g": {"at": "layer3", "type": "backward_pre", "actions": [{"name": "replace_input", "op": "zero"}]}, **RECORD_PARAMS}
    f = run_hooks(hooks, **GRAD)
    plain = param_grads(reference_model, dataset, PARAMS)
    for name in ("conv1.weight", "layer2.0.conv1.weight", "layer3.0.conv1.weight"):
        assert not f[f"captures/w/{name}/grad"][:].any()
    close(f["captures/w/fc.weight/grad"][:], plain["fc.weight"])


def test_modify_grad_on_a_parameter(run_hooks, reference_model, dataset):
    hooks = {"p": {"at": "fc.weight", "type": "param", "actions": [{"name": "modify_grad", "op": "scale", "factor": -1.0}, "record"]}}
    f = run_hooks(hooks, **GRAD)
    close(f["captures/p/fc.weight/grad"][:], -param_grads(reference_model, dataset, ["fc.weight"])["fc.weight"])


def test_patching_every_sample_restores_the_clean_logits(tmp_path, checkpoint):
    clean_cfg = make_cfg(tmp_path / "clean", checkpoint, {"l2": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}, **LOGITS})
    clean = hookrun.run(clean_cfg).path
    patched_cfg = make_cfg(tmp_path / "patched", checkpoint, {
        "noise": {"at": "conv1", "type": "forward_pre", "actions": [{"name": "replace_input", "op": "noise", "std": 1.0}]},
        "p": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", "op": "patch", "source": str(clean)}]},
        **LOGITS}, **{"data.batch_size": 5})  # a different batch size: rows matched by sample index
    with h5py.File(clean) as a, h5py.File(hookrun.run(patched_cfg).path) as b:
        np.testing.assert_array_equal(a["captures/logits/fc/output"][:], b["captures/logits/fc/output"][:])
    unpatched = make_cfg(tmp_path / "noisy", checkpoint, {k: v for k, v in patched_cfg["hooks"].items() if k != "p"})
    with h5py.File(clean) as a, h5py.File(hookrun.run(unpatched).path) as b:
        assert not np.allclose(a["captures/logits/fc/output"][:], b["captures/logits/fc/output"][:])


def patch_hooks(source, **extra):
    return {"p": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", "op": "patch", "source": str(source), **extra}]}}


def test_patch_source_errors_come_before_any_batch(tmp_path, checkpoint):
    with pytest.raises(ConfigError, match=r"nope.h5': no file '.*nope.h5' \(run the clean run first"):
        hookrun.run(make_cfg(tmp_path, checkpoint, patch_hooks(tmp_path / "nope.h5")))
    partial = hookrun.run(make_cfg(tmp_path / "src", checkpoint, {"l": {"at": "layer2", "type": "forward", "actions": ["record"]}}, **{"data.limit": 1})).path
    with pytest.raises(ConfigError, match=r"lacks sample index 4, 5, 6, 7, 8 \.\.\. \(8 of this run's samples\)"):
        hookrun.run(make_cfg(tmp_path, checkpoint, patch_hooks(partial)))
    with pytest.raises(ConfigError, match=r"has no capture of module 'layer2', role 'output', hook 'x'; it has \(hook/module/role\): l/layer2/input, l/layer2/output"):
        hookrun.run(make_cfg(tmp_path, checkpoint, patch_hooks(partial, hook="x")))
    assert not (tmp_path / "captures.h5").exists()


@pytest.mark.parametrize("hooks, message", [
    ({"z": {"at": "layer2", "type": "forward_pre", "actions": [{"name": "modify_output", "op": "zero"}]}},
     "modify_output does not fit a forward_pre hook; it works with type: forward"),
    ({"z": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", "op": "zap"}]}}, "unknown op 'zap'"),
    ({"z": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", "op": "scale"}]}}, "op scale needs factor"),
    ({"z": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factr": 1}]}}, "op scale has no parameter factr"),
    ({"z": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output"}]}}, "needs op: one of"),
])
def test_misused_actions_are_config_errors(tmp_path, checkpoint, hooks, message):
    with pytest.raises(ConfigError, match=message):
        hookrun.run(make_cfg(tmp_path, checkpoint, hooks))


@pytest.mark.parametrize("op, got", [("wrong_shape", r"shape \(4, 1, 4, 4\) torch.float32 on cpu"),
                                     ("forgets_return", "NoneType")])
def test_a_wrong_replacement_names_the_op_hook_module_and_shapes(tmp_path, checkpoint, op, got):
    """(it named the hook alone: 'hook 'bad' at layer2: the replacement for output is a NoneType'; the reference
    shape: layer2's own output, by a raw forward hook on the same model and batch)"""
    model, seen = small_resnet(), []
    model.layer2.register_forward_hook(lambda m, a, out: seen.append(out))
    with torch.no_grad():
        model.eval()(next(batches(RandomTensors(N, SHAPE, CLASSES, seed=7)))[0])
    shape = re.escape(str(tuple(seen[0].shape)))
    hooks = {"bad": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", "op": {"_target_": f"toy_models.{op}", "_partial_": True}}]}}
    with pytest.raises(RunError, match=rf"^hooks\.bad\.actions\.0: op toy_models\.{op} returned {got} at layer2 \(output, batch 0\); "
                                       rf"an op returns a tensor like the one it is given: shape {shape} torch.float32 on cpu$"):
        hookrun.run(make_cfg(tmp_path, checkpoint, hooks))
    with h5py.File(tmp_path / "captures.h5") as f:
        assert f.attrs["status"] == "failed"


def test_modify_output_of_a_list_of_dicts_per_sample_is_refused_not_skipped(tmp_path):
    """A detection model's output (a dict per sample): scaling it changed nothing and the run said
    nothing; now it is one line naming what to do instead."""
    import pytest

    import hookrun
    from hookrun.errors import RunError

    class Detector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(3, 2)

        def forward(self, x):
            y = self.head(x)
            return [{"boxes": y[i:i + 1], "scores": y[i]} for i in range(len(x))]

    hooks = {"d": {"at": "", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 2}]}}
    with pytest.raises(RunError, match=r"returns a list with a dict per sample .* modify a tensor inside the model"):
        hookrun.run({"hooks": hooks, "data": {"batch_size": 2, "target": None}, "progress": False,
                     "output": {"path": str(tmp_path / "d.h5")}},
                    model=Detector(), dataset=torch.utils.data.TensorDataset(torch.randn(4, 3)))
