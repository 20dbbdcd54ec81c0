"""Actions and ops declare what they can do, so a user's own action or op is treated as
a built-in one. References: the raw model with a plain forward hook, and numpy on the rows."""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pytest
import torch
from conftest import make_cfg, small_resnet

import hookrun
from hookrun.errors import ConfigError, RunError
from hookrun.hooks.actions import Action, register_action
from hookrun.hooks.ops import register_op
from hookrun.store.records import Capture, CaptureKey


@register_action("test_channel_means")
class ChannelMeans(Action):
    """A user's recording action: each sample's per-channel mean of the output."""

    records = True

    def __call__(self, ev) -> None:
        out = ev.tensors["output"].detach()
        key = CaptureKey(ev.hook, ev.module, ev.type, "output", ev.call)
        self.env.captures.add(Capture(key, out.mean(dim=(2, 3)).clone(), False, "float32"))


@register_action("test_zero_output")
class ZeroOutput(Action):
    modifies = True
    fits = frozenset({"forward"})

    def __call__(self, ev) -> None:
        ev.replace("output", torch.zeros_like(ev.tensors["output"]))


@register_op("test_scale_by_depth")
def scale_by_depth(*, build):
    """A user op that needs its hook point: scale by the number of dots in the module's path + 1."""
    factor = build.point.module.count(".") + 1.0
    return lambda x, ctx: x * factor


def test_a_user_action_that_records_is_seen_by_early_stop_and_the_warning(tmp_path, checkpoint, dataset, caplog):
    hooks = {"m": {"at": "layer1", "type": "forward", "actions": [{"name": "test_channel_means"}]}}
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path = hookrun.run(make_cfg(tmp_path, checkpoint, hooks, early_stop=True)).path
    assert "no hook records anything" not in caplog.text
    model = small_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    seen = []
    model.layer1.register_forward_hook(lambda m, i, o: seen.append(o.mean(dim=(2, 3))))
    with torch.no_grad():
        model.eval()(torch.stack([dataset[i][0] for i in range(len(dataset))]))
    with h5py.File(path) as f:
        np.testing.assert_allclose(f["captures/m/layer1/output"][:], seen[0].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("actions, names", [([{"name": "test_zero_output"}], "test_zero_output"),
                                             ([{"name": "modify_output", "op": "scale", "factor": 0.0}, "record"],
                                              "modify_output, record")])
def test_an_action_that_modifies_is_refused_by_early_stop_by_its_name(tmp_path, checkpoint, actions, names):
    """The refusal names the actions as the hook gives them (it named their classes: ['ModifyOutput'])."""
    hooks = {"z": {"at": "layer1", "type": "forward", "actions": actions}}
    with pytest.raises(ConfigError, match=f"early_stop=true needs hooks that only record .*; hooks.z is type forward "
                                          f"with {names}$"):
        hookrun.run(make_cfg(tmp_path, checkpoint, hooks, early_stop=True))


def test_a_user_op_gets_the_build_context(tmp_path, checkpoint, dataset):
    hooks = {"s": {"at": "layer1.0", "type": "forward", "actions": [{"name": "modify_output", "op": "test_scale_by_depth"}]},
             "r": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    path = hookrun.run(make_cfg(tmp_path, checkpoint, hooks)).path
    model = small_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.layer1[0].register_forward_hook(lambda m, i, o: o * 2.0)  # 'layer1.0': one dot, factor 2
    with torch.no_grad():
        want = model.eval()(torch.stack([dataset[i][0] for i in range(len(dataset))]))
    with h5py.File(path) as f:
        np.testing.assert_allclose(f["captures/r/fc/output"][:], want.numpy(), rtol=1e-4, atol=1e-5)


SHADOW = """
import sys
from hookrun.errors import ConfigError, RunError
from hookrun.hooks.actions import Action, register_action
if {imported}:
    import hookrun.hooks.actions.top_examples
assert ("hookrun.hooks.actions.top_examples" in sys.modules) == {imported}
try:
    register_action("top_examples")(type("MyTop", (Action,), {{}}))
except ConfigError as exc:
    print(exc)
from hookrun.hooks.actions import ACTIONS
print(ACTIONS.get("top_examples").__module__)
"""


@pytest.mark.parametrize("imported", [False, True])
def test_a_user_action_named_like_a_built_in_one_is_refused_in_one_line(imported):
    """hookrun's top_examples, its module imported or not yet: the user's class never replaces it."""
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run([sys.executable, "-c", SHADOW.format(imported=imported)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": ""}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["action 'top_examples' is one of hookrun's own actions; give yours another name",
                                        "hookrun.hooks.actions.top_examples"]


class Exit(BaseException):
    """A user's own BaseException (not an Exception): it went past every handler as a traceback."""


RAISED = {"value": ValueError("bad rows\n[red]second line[/red] " + "x" * 5000), "exit": SystemExit(0), "base": Exit("mine")}


@register_action("test_raising")
class Raising(Action):
    records = True
    raised = "value"

    def __call__(self, ev) -> None:
        raise RAISED[type(self).raised]


@register_op("test_raising_op")
def raising_op(*, build):
    def op(x, ctx):
        raise RAISED[Raising.raised]
    return op


@pytest.mark.parametrize("raised", ["value", "exit", "base"])
@pytest.mark.parametrize("action", ["test_raising", "op"])
def test_a_user_action_or_op_that_raises_is_one_line_naming_it(tmp_path, checkpoint, monkeypatch, raised, action):
    """An action's exception was 'the model's forward failed: ResNet(...) raised ValueError', naming no
    action; sys.exit(0) in an action or an op ended the command with status 0 beside a failed file, and
    a BaseException of the user's printed its traceback. Now: one RunError line (exit status 1) naming
    the hook, the action or op and the batch, the message on one line and cut; the file says failed (h5py)."""
    monkeypatch.setattr(Raising, "raised", raised)
    spec = {"name": "test_raising"} if action == "test_raising" else {"name": "modify_output", "op": "test_raising_op"}
    hooks = {"m": {"at": "layer1", "type": "forward", "actions": [spec]}}
    cfg = make_cfg(tmp_path, checkpoint, hooks)
    with pytest.raises(RunError) as info:
        hookrun.run(cfg)
    line, exc = str(info.value), RAISED[raised]
    named = "action test_raising failed at layer1 (forward hook" if action == "test_raising" else "op test_raising_op failed at layer1"
    assert line.startswith(f"hooks.m.actions.0: {named}") and "batch 0" in line, line
    assert f"{type(exc).__name__}: " in line and "\n" not in line and len(line) < 700, line
    assert info.value.__cause__ is exc and "the model's forward failed" not in line
    with h5py.File(cfg["output"]["path"]) as f:
        assert f.attrs["status"] == "failed"


@register_action("test_normalises_in_place")
class NormalisesInPlace(Action):
    """Normalises the output before recording it, on the model's own tensor (div_): the model goes on with it."""

    records = True

    def __call__(self, ev) -> None:
        out = ev.tensors["output"]
        out.div_(out.norm())
        self.env.captures.add(Capture(CaptureKey(ev.hook, ev.module, ev.type, "output", ev.call), out.clone(), False))


def halves_in_place(ev) -> None:  # a `_target_` action: the same mistake
    ev.tensors["output"].mul_(0.5)


@pytest.mark.parametrize("spec, name", [({"name": "test_normalises_in_place"}, "test_normalises_in_place"),
                                        ({"_target_": f"{__name__}.halves_in_place", "_partial_": True},
                                         "halves_in_place")])
def test_a_user_action_that_changes_its_tensor_in_place_without_declaring_it_is_one_line(tmp_path, checkpoint, dataset,
                                                                                          spec, name):
    """It was a `complete` file whose fc output was not the model's (the reference: the raw model without
    hooks), from an action that says it only records; now one line naming it, and the file says failed."""
    hooks = {"n": {"at": "layer1", "type": "forward", "actions": [spec]},
             "r": {"at": "fc", "type": "forward", "actions": ["record"]}}
    cfg = make_cfg(tmp_path, checkpoint, hooks)
    with pytest.raises(RunError, match=f"^hooks.n.actions.0: action {name} changed the output of layer1 in place, but "
                                       f"does not declare modifies = True"):
        hookrun.run(cfg)
    with h5py.File(cfg["output"]["path"]) as f:
        assert f.attrs["status"] == "failed"
    halves_in_place.modifies = True  # declared: the model's output is the halved layer1's, as a raw hook gives it
    try:
        hooks["n"]["actions"] = [{"_target_": f"{__name__}.halves_in_place", "_partial_": True}]
        path = hookrun.run(make_cfg(tmp_path / "declared", checkpoint, hooks)).path
    finally:
        del halves_in_place.modifies
    model = small_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.layer1.register_forward_hook(lambda m, i, o: o * 0.5)
    with torch.no_grad():
        want = model.eval()(torch.stack([dataset[i][0] for i in range(len(dataset))]))
    with h5py.File(path) as f:
        np.testing.assert_allclose(f["captures/r/fc/output"][:], want.numpy(), rtol=1e-4, atol=1e-5)


@register_action("test_keeps_without_a_copy")
class KeepsWithoutACopy(Action):
    """Records the hooked output itself (no .clone()): the model's next module changes it in place."""

    records = True

    def __call__(self, ev) -> None:
        key = CaptureKey(ev.hook, ev.module, ev.type, "output", ev.call)
        self.env.captures.add(Capture(key, ev.tensors["output"].detach(), False))


def test_a_user_actions_capture_of_the_hooked_tensor_is_what_the_hook_saw(tmp_path):
    """Before a ReLU(inplace=True), the file held the ReLU's output (no negative value; 0.73 off), in a file
    marked complete. Reference: the Linear called directly on the run's batches (4 and 2 rows: a matrix product
    of 6 rows may round its last bit otherwise on another BLAS); h5py on the file."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(inplace=True), torch.nn.Linear(5, 2)).eval()
    x = torch.randn(6, 4)
    cfg = {"device": "cpu", "progress": False, "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "k.h5")},
           "hooks": {"k": {"at": "0", "type": "forward", "actions": ["test_keeps_without_a_copy"]}}}
    path = hookrun.run(cfg, model=model, dataset=x).path
    with torch.no_grad():
        want = torch.cat([model[0](x[:4]), model[0](x[4:])]).numpy()
    assert (want < 0).any()
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["captures/k/0/output"][:], want)
