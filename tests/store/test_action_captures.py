"""What a user's action hands the store (env.captures.add) as it is written: every dtype numpy has, a
bfloat16 tensor, zero-width rows; and what is no capture of one row per sample (None, a list, a numpy
array, a 0-d tensor, more or fewer rows than the batch's samples) is one line naming the hook, before
the batch is written. References: the tensors the action gave, kept by the test, and h5py on the file."""

from __future__ import annotations

from dataclasses import dataclass

import h5py
import numpy as np
import pytest
import torch

import hookrun
from hookrun.config.plugins import KindPlugin, register_plugin
from hookrun.config.schema import _PLUGINS
from hookrun.errors import RunError
from hookrun.hooks.actions import Action, register_action
from hookrun.runner.kinds import NOTHING, RunKind, plain_forward
from hookrun.store.records import Capture, CaptureKey

GIVEN: list = []  # what the action handed over, batch by batch (copies)
MAKE = {
    "bool": lambda out: out > 0,
    "int64": lambda out: (out * 1e6).long() + 2**40,
    "uint8": lambda out: (out.abs() * 100).to(torch.uint8),
    "float16": lambda out: out.half(),
    "float64": lambda out: out.double() + 1e-12,
    "complex64": lambda out: torch.complex(out, -out),
    "bfloat16": lambda out: out.bfloat16(),
    "zero_width": lambda out: out[:, :0],
    "requires_grad": lambda out: out.detach().clone().requires_grad_(),
    "none": lambda out: None,
    "list": lambda out: out.tolist(),
    "numpy": lambda out: out.numpy(),
    "scalar": lambda out: out.sum(),
    "fewer_rows": lambda out: out[:2],
    "more_rows": lambda out: torch.cat([out, out]),
}


@register_action("test_hands_over")
class HandsOver(Action):
    records = True
    make = "bool"

    def __call__(self, ev) -> None:
        value = MAKE[type(self).make](ev.tensors["output"].detach())
        GIVEN.append(value.detach().clone() if isinstance(value, torch.Tensor) else value)
        self.env.captures.add(Capture(CaptureKey(ev.hook, ev.module, ev.type, "output", ev.call), value, False))


def run(tmp_path, make: str):
    GIVEN.clear()
    HandsOver.make = make
    torch.manual_seed(0)
    cfg = {"model": {"_target_": "torch.nn.Linear", "in_features": 4, "out_features": 3},
           "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": 6, "shape": [4], "num_classes": 3,
                                "seed": 7}, "batch_size": 4},
           "device": "cpu", "progress": False, "output": {"path": str(tmp_path / f"{make}.h5")},
           "hooks": {"m": {"at": "", "type": "forward", "actions": [{"name": "test_hands_over"}]}}}
    return cfg, lambda: hookrun.run(cfg)


@pytest.mark.parametrize("make", ["bool", "int64", "uint8", "float16", "float64", "complex64", "bfloat16", "zero_width",
                                  "requires_grad"])
def test_a_user_actions_capture_is_written_as_it_was_given(tmp_path, make):
    """bfloat16 failed at batch 0 on the writer thread ('TypeError: Got unsupported ScalarType BFloat16'):
    now float32 holding the bfloat16 values exactly, its torch_dtype attribute bfloat16."""
    _, go = run(tmp_path, make)
    path = go().path
    want = torch.cat(GIVEN)
    with h5py.File(path) as f:
        ds = f["captures/m/__model__/output"]
        assert f.attrs["status"] == "complete" and ds.attrs["torch_dtype"] == str(want.dtype).removeprefix("torch.")
        got = ds[:]
    want = want.detach().float() if make == "bfloat16" else want.detach()
    assert got.dtype == want.numpy().dtype and got.shape == (6, *want.shape[1:])
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.parametrize("make, said", [
    ("none", "is None, not a torch.Tensor"), ("list", "is a list, not a torch.Tensor"),
    ("numpy", "is a ndarray, not a torch.Tensor"), ("scalar", r"has shape \(\): one row per sample needs a first "
                                                               r"axis of the batch's 4 sample\(s\)"),
    ("fewer_rows", r"has shape \(2, 3\): one row per sample needs a first axis of the batch's 4 sample\(s\)"),
    ("more_rows", r"has shape \(8, 3\): one row per sample needs a first axis of the batch's 4 sample\(s\)"),
])
def test_what_is_no_capture_of_one_row_per_sample_is_one_line_before_the_batch_is_written(tmp_path, make, said):
    """Before: None, a list or an array failed on the writer thread ("AttributeError: 'NoneType' object has no
    attribute 'numel'"), naming no hook; 2 or 8 rows for a batch of 4 were written as a `complete` file whose
    rows were labelled by sample position (8 rows: an index of 8 entries for 12 rows)."""
    cfg, go = run(tmp_path, make)
    with pytest.raises(RunError, match=f"^hooks.m: the capture captures/m/__model__/output {said}"):
        go()
    with h5py.File(cfg["output"]["path"]) as f:
        assert f.attrs["status"] == "failed" and "captures" not in f


@dataclass
class RowsBlock:
    pass


class HalfRows(RunKind):
    """A kind whose own capture (no hook's) has half the batch's rows."""

    def step(self, model, call, session):
        out = plain_forward(model, call)
        self.ctx.env.captures.add(Capture(CaptureKey("halfrows", "", "halfrows", "sum"), out.sum(1)[:2].detach(), False))
        return NOTHING


def test_a_kinds_own_capture_is_named_by_its_kind_not_as_a_hook(tmp_path):
    """It said 'hooks.halfrows: the capture ...', though no hook of that name is configured (the reference: the
    run's `hooks:` is empty, and the kind's class is this module's HalfRows)."""
    register_plugin(KindPlugin("halfrows", block=RowsBlock, run=HalfRows))
    try:
        cfg, _ = run(tmp_path, "none")
        cfg = {**cfg, "hooks": None, "halfrows": {}}
        with pytest.raises(RunError, match=rf"^the halfrows kind \({__name__}\.HalfRows\): the capture "
                                           r"captures/halfrows/__model__/sum has shape \(2,\): one row per sample needs a "
                                           r"first axis of the batch's 4 sample\(s\)"):
            hookrun.run(cfg)
    finally:
        _PLUGINS.pop("halfrows", None)
