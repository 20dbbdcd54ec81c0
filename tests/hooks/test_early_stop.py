"""early_stop learns where to stop from a one-sample probe, so no batch (the first included)
computes what the cache does not need; a batch that runs otherwise than the probe is refused.
References: the same model called directly, a hand count of what its head sees, plain h5py."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch import nn
from toy_runs import toy_cfg

import hookrun
from hookrun.errors import RunError


class HeadSizes(nn.Module):
    """Notes the batch size of every call of its head (the part early_stop should skip)."""

    seen: list[int] = []

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3)
        self.head.register_forward_pre_hook(lambda m, args: HeadSizes.seen.append(int(args[0].shape[0])))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def test_no_batch_runs_the_head_only_the_one_sample_probe(tmp_path):
    model = HeadSizes()
    data = torch.utils.data.TensorDataset(torch.randn(10, 4), torch.zeros(10, dtype=torch.long))
    cfg = {"data": {"batch_size": 4}, "device": "cpu", "early_stop": True, "progress": False,
           "hooks": {"b": {"at": "body", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
           "output": {"path": str(tmp_path / "c.h5")}}
    HeadSizes.seen = []
    hookrun.run(cfg, model=model, dataset=data)
    assert HeadSizes.seen == [1]  # the probe's one sample; batches 0, 1 and 2 stop after body
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_array_equal(f["samples/index"][:], np.arange(10))  # the probe adds no row
        with torch.no_grad():
            want = model.body(data.tensors[0]).numpy()
        np.testing.assert_allclose(f["captures/b/body/output"][:], want, rtol=1e-6, atol=1e-7)
        assert f.attrs["status"] == "complete"


def test_early_stop_refuses_a_module_that_runs_again_after_the_stop_point(tmp_path):
    hooks = {"m": {"at": "m", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = toy_cfg(tmp_path, "toy_models.RepeatWhenNegative", hooks, early_stop=True)
    with pytest.raises(RunError, match=r"early_stop: in batch 1 the forward goes on to a Linear after the stop point"):
        hookrun.run(cfg)
    with h5py.File(tmp_path / "captures.h5") as f:
        assert f.attrs["status"] == "failed" and f.attrs["steps_complete"] == 1


def test_early_stop_refuses_a_batch_that_fires_fewer_calls(tmp_path):
    hooks = {"m": {"at": "m", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "h": {"at": "head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = toy_cfg(tmp_path, "toy_models.RepeatWhenNegative", hooks, early_stop=True)
    cfg["data"]["dataset"] = {"_target_": "toy_models.SignedRows"}
    cfg["data"]["batch_size"] = 4
    with pytest.raises(RunError, match=r"early_stop: batch 1 fires hook 'm' at m \(call 1\) where the probe \(the dataset's first sample\) fired hook 'h' at head"):
        hookrun.run(cfg)


class Stack(nn.Module):
    """GPT-2's layout in small: body (emb, a ModuleList of blocks, a norm), then a wide head."""

    def __init__(self, loops: int = 1, reuse_emb: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Module()
        self.body.emb = nn.Linear(4, 8)
        self.body.h = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.body.ln = nn.LayerNorm(8)
        self.head = nn.Linear(8, 50)
        self.loops, self.reuse_emb = loops, reuse_emb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.body.emb(x)
        for _ in range(self.loops):  # loops=2: a looped stack comes back to every block
            for block in self.body.h:
                x = torch.tanh(block(x))
        if self.reuse_emb:  # the embedding called again after the stack, by its own parent's code
            x = self.body.emb(x[:, :4])
        return self.head(self.body.ln(x))


def run_counting_head(tmp_path, model: nn.Module, at: str) -> tuple[list[int], dict, torch.Tensor]:
    """hookrun.run with early_stop on `at`; the head's forward calls (batch sizes) seen by a raw
    forward hook, and the file's captures."""
    seen: list[int] = []
    handle = model.head.register_forward_hook(lambda m, args, out: seen.append(int(args[0].shape[0])))
    data = torch.utils.data.TensorDataset(torch.randn(10, 4))
    cfg = {"data": {"batch_size": 4}, "device": "cpu", "early_stop": True, "progress": False,
           "hooks": {"b": {"at": at, "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
           "output": {"path": str(tmp_path / "c.h5")}}
    try:
        hookrun.run(cfg, model=model, dataset=data)
    finally:
        handle.remove()
    with h5py.File(tmp_path / "c.h5") as f:
        captures = {k: v[:] for k, v in f[f"captures/b/{at}"].items()}
    return seen, captures, data.tensors[0]


def raw_outputs(model: nn.Module, module: nn.Module, x: torch.Tensor) -> list[np.ndarray]:
    """Every output of `module` in one plain forward, by a raw PyTorch hook: the reference."""
    got: list[np.ndarray] = []
    handle = module.register_forward_hook(lambda m, args, out: got.append(out.detach().numpy().copy()))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return got


def test_the_probe_stops_past_the_last_hooked_module_never_running_the_head(tmp_path):
    model = Stack()
    seen, captures, x = run_counting_head(tmp_path, model, "body.h.1")
    assert seen == []  # neither the probe nor any batch computes the head
    (want,) = raw_outputs(model, model.body.h[1], x)
    np.testing.assert_allclose(captures["output"], want, rtol=1e-6, atol=1e-7)


def test_the_probe_runs_on_where_a_hooked_module_may_be_called_again(tmp_path):
    """A looped stack (the blocks' ModuleList) and a module its parent calls twice: the probe goes
    on past the first firing, so the second is learned and recorded, as a plain hook sees it."""
    for model, module, at in ((Stack(loops=2), lambda m: m.body.h[1], "body.h.1"),
                              (Stack(reuse_emb=True), lambda m: m.body.emb, "body.emb")):
        seen, captures, x = run_counting_head(tmp_path, model, at)
        want = raw_outputs(model, module(model), x)
        assert len(want) == 2 and sorted(captures) == ["output", "output@1"], at
        np.testing.assert_allclose(captures["output"], want[0], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(captures["output@1"], want[1], rtol=1e-6, atol=1e-7)
        assert seen == [], at  # still cut before the head
        (tmp_path / "c.h5").unlink()


def test_a_module_under_two_names_gets_a_full_probe(tmp_path):
    model = Stack()
    model.tied = model.body.h[1]  # reachable as body.h.1 and as tied: the probe cannot tell where it is called
    seen, captures, x = run_counting_head(tmp_path, model, "body.h.1")
    assert seen == [1]  # the probe's one sample, in full; no batch
    (want,) = raw_outputs(model, model.body.h[1], x)
    np.testing.assert_allclose(captures["output"], want, rtol=1e-6, atol=1e-7)
