"""An SAE trained on a tensor other than a module's output (its input, say) names that tensor in its
cfg.json hook_name (MODULE/ROLE: `2/input`), so `op: splice`, which replaces the module's output, refuses
it at that module in one line, and `sae.evaluate`, which splices at the module's output, refuses it before
any step. Reference: raw PyTorch forward and forward pre-hooks on the same model and items say which
tensor the cache's rows are."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("sae_lens")


class Items(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), int(torch.randint(0, 2, (), generator=g))


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16)).eval()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("site")
    record = [{"name": "record", "what": "input"}, {"name": "record", "what": "output"}]
    cfg = {"hooks": {"mlp": {"at": "2", "type": "forward", "actions": record}}, "device": "cpu", "progress": False,
           "data": {"batch_size": 16}, "output": {"path": str(folder / "cache.h5")}}
    return str(hookrun.run(cfg, model=make_model(), dataset=Items()).path), folder


def train(cache: str, folder, capture: str, **over) -> dict:
    cfg = {"device": "cpu", "progress": False, "data": {"batch_size": 16}, "output": {"path": str(folder / f"{capture.replace('/', '_')}.h5")},
           "sae": {"from": cache, "capture": capture, "architecture": "topk", "k": 4, "d_sae": 32, "lr": 1e-3,
                   "batch_rows": 16, "rows": 64, "shuffle": False, "out": str(folder / capture.replace("/", "_")), **over}}
    return cfg


def splice(folder, sae: str, at: str = "2", **action) -> dict:
    return {"device": "cpu", "progress": False, "data": {"batch_size": 16}, "output": {"path": str(folder / "splice.h5"), "overwrite": True},
            "hooks": {"sae": {"at": at, "type": "forward",
                              "actions": [{"name": "modify_output", "op": "splice", "path": sae, **action}]}}}


def test_an_sae_of_a_modules_input_is_refused_at_its_output(cache):
    path, folder = cache
    model = make_model()
    seen: dict[str, list] = {"input": [], "output": []}
    model[2].register_forward_pre_hook(lambda m, args: seen["input"].append(args[0]))
    model[2].register_forward_hook(lambda m, args, out: seen["output"].append(out))
    with torch.no_grad():
        for x, _ in DataLoader(Items(), batch_size=16):
            model(x)
    with h5py.File(path) as f:
        for role in ("input", "output"):  # the rows are the tensors the raw hooks saw
            np.testing.assert_allclose(f[f"captures/mlp/2/{role}"][:], torch.cat(seen[role]).numpy(), rtol=1e-6)
    assert not np.allclose(torch.cat(seen["input"]).numpy(), torch.cat(seen["output"]).numpy(), atol=0.1)

    for role, name in (("input", "2/input"), ("output", "2")):
        hookrun.run(train(path, folder, f"mlp/2/{role}"), model=make_model(), dataset=Items())
        cfg = json.loads((folder / f"mlp_2_{role}" / "cfg.json").read_text())
        assert cfg["metadata"]["hook_name"] == name  # (the input's SAE said "2", as if trained on the output)
    # the output's SAE splices at 2; the input's is one line, unless other_module: true
    assert hookrun.run(splice(folder, str(folder / "mlp_2_output")), model=make_model(), dataset=Items()).status == "complete"
    with pytest.raises(ConfigError) as info:
        hookrun.run(splice(folder, str(folder / "mlp_2_input")), model=make_model(), dataset=Items())
    assert str(info.value) == (
        f"hooks.sae.actions.0: op splice at 2: the SAE in {folder / 'mlp_2_input'} was trained on 2's input (its "
        "hook_name 2/input), not on the output op splice replaces; splice it at a module whose output that tensor "
        "is, or give other_module: true to splice it here anyway")
    assert hookrun.run(splice(folder, str(folder / "mlp_2_input"), other_module=True), model=make_model(),
                       dataset=Items()).status == "complete"


def test_evaluate_refuses_an_input_capture_before_any_step(cache):
    path, folder = cache
    cfg = train(path, folder, "mlp/2/input", evaluate={"data": {}})
    cfg["loss"] = {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}
    cfg["output"]["path"] = str(folder / "evaluated.h5")
    with pytest.raises(ConfigError) as info:
        hookrun.run(cfg, model=make_model(), dataset=Items())
    assert str(info.value) == (
        "sae.evaluate: the capture mlp/2/input is 2's input, but the evaluation splices the SAE at 2's output; "
        "train on a module's output (mlp/2/output) or drop sae.evaluate (op: splice with other_module: true "
        "splices it where you choose)")
    assert not (folder / "evaluated.h5").exists()


class Pair(nn.Module):
    """A module whose output is a tuple: its parts are output.0 and output.1."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 16)

    def forward(self, x):
        y = self.lin(x)
        return y, 2 * y


def test_an_sae_of_a_tuples_part_splices_there_with_its_arg_only(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(Pair()).eval()
    with torch.no_grad():
        x = torch.stack([Items()[i][0] for i in range(64)])
        want = model[0](x)
    cfg = {"hooks": {"p": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
           "device": "cpu", "progress": False, "data": {"batch_size": 16}, "output": {"path": str(tmp_path / "c.h5")}}
    path = str(hookrun.run(cfg, model=model, dataset=Items()).path)
    with h5py.File(path) as f:  # the parts as the raw forward gives them
        for i in (0, 1):
            np.testing.assert_allclose(f[f"captures/p/0/output.{i}"][:], want[i].numpy(), rtol=1e-6)
    for i in (0, 1):
        hookrun.run(train(path, tmp_path, f"p/0/output.{i}"), model=model, dataset=Items())
        assert json.loads((tmp_path / f"p_0_output.{i}" / "cfg.json").read_text())["metadata"]["hook_name"] == f"0/output.{i}"
    spliced = hookrun.run(splice(tmp_path, str(tmp_path / "p_0_output.0"), at="0", arg=0), model=model, dataset=Items())
    assert spliced.status == "complete"
    with pytest.raises(ConfigError, match=r"trained on 0's output.1 \(its hook_name 0/output.1\)"):
        hookrun.run(splice(tmp_path, str(tmp_path / "p_0_output.1"), at="0", arg=0), model=model, dataset=Items())
