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
from torch.utils.data import DataLoader

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("sae_lens")
from sae_items import HELD_OUT, Items, make_model  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("site")
    record = [{"name": "record", "what": "input"}, {"name": "record", "what": "output"}]
    cfg = {"hooks": {"mlp": {"at": "2", "type": "forward", "actions": record}}, "device": "cpu", "progress": False,
           "data": {"batch_size": 16}, "output": {"path": str(folder / "cache.h5")}}
    return str(hookrun.run(cfg, model=make_model(), dataset=Items(classes=2)).path), folder


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
        for x, _ in DataLoader(Items(classes=2), batch_size=16):
            model(x)
    with h5py.File(path) as f:
        for role in ("input", "output"):  # the rows are the tensors the raw hooks saw
            np.testing.assert_allclose(f[f"captures/mlp/2/{role}"][:], torch.cat(seen[role]).numpy(), rtol=1e-6)
    assert not np.allclose(torch.cat(seen["input"]).numpy(), torch.cat(seen["output"]).numpy(), atol=0.1)

    for role, name in (("input", "2/input"), ("output", "2")):
        hookrun.run(train(path, folder, f"mlp/2/{role}"), model=make_model(), dataset=Items(classes=2))
        cfg = json.loads((folder / f"mlp_2_{role}" / "cfg.json").read_text())
        assert cfg["metadata"]["hook_name"] == name  # (the input's SAE said "2", as if trained on the output)
    # the output's SAE splices at 2; the input's is one line, unless other_module: true
    assert hookrun.run(splice(folder, str(folder / "mlp_2_output")), model=make_model(), dataset=Items(classes=2)).status == "complete"
    with pytest.raises(ConfigError) as info:
        hookrun.run(splice(folder, str(folder / "mlp_2_input")), model=make_model(), dataset=Items(classes=2))
    assert str(info.value) == (
        f"hooks.sae.actions.0: op splice at 2: the SAE in {folder / 'mlp_2_input'} was trained on 2's input (its "
        "hook_name 2/input), not on the output op splice replaces; splice it at a module whose output that tensor "
        "is, or give other_module: true to splice it here anyway")
    assert hookrun.run(splice(folder, str(folder / "mlp_2_input"), other_module=True), model=make_model(),
                       dataset=Items(classes=2)).status == "complete"


def test_evaluate_refuses_an_input_capture_before_any_step(cache):
    path, folder = cache
    cfg = train(path, folder, "mlp/2/input", evaluate={"data": {"dataset": HELD_OUT}})
    cfg["loss"] = {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}
    cfg["output"]["path"] = str(folder / "evaluated.h5")
    with pytest.raises(ConfigError) as info:
        hookrun.run(cfg, model=make_model(), dataset=Items(classes=2))
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
        x = torch.stack([Items(classes=2)[i][0] for i in range(64)])
        want = model[0](x)
    cfg = {"hooks": {"p": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
           "device": "cpu", "progress": False, "data": {"batch_size": 16}, "output": {"path": str(tmp_path / "c.h5")}}
    path = str(hookrun.run(cfg, model=model, dataset=Items(classes=2)).path)
    with h5py.File(path) as f:  # the parts as the raw forward gives them
        for i in (0, 1):
            np.testing.assert_allclose(f[f"captures/p/0/output.{i}"][:], want[i].numpy(), rtol=1e-6)
    for i in (0, 1):
        hookrun.run(train(path, tmp_path, f"p/0/output.{i}"), model=model, dataset=Items(classes=2))
        assert json.loads((tmp_path / f"p_0_output.{i}" / "cfg.json").read_text())["metadata"]["hook_name"] == f"0/output.{i}"
    spliced = hookrun.run(splice(tmp_path, str(tmp_path / "p_0_output.0"), at="0", arg=0), model=model, dataset=Items(classes=2))
    assert spliced.status == "complete"
    with pytest.raises(ConfigError, match=r"trained on 0's output.1 \(its hook_name 0/output.1\)"):
        hookrun.run(splice(tmp_path, str(tmp_path / "p_0_output.1"), at="0", arg=0), model=model, dataset=Items(classes=2))


class First(nn.Module):
    def forward(self, pair):
        return pair[0]


def test_evaluate_splices_a_tuples_part_where_it_was_trained(tmp_path):
    """From a cache's output.0 and on the fly at a module whose output is a tuple (its first element), the
    evaluation splices with arg: 0 (it refused, after the training: 'its output is a tuple ...; splice one
    tensor of it with arg: 0'). Reference: SAELens' own SAE on a raw forward hook, the loss by torch."""
    import sae_lens
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(Pair(), First(), nn.Linear(16, 16)).eval()
    cfg = {"hooks": {"p": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
           "device": "cpu", "progress": False, "data": {"batch_size": 16}, "output": {"path": str(tmp_path / "c.h5")}}
    path = str(hookrun.run(cfg, model=model, dataset=Items(classes=2)).path)
    loss = {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}
    from hookrun.data import RandomTensors

    held = RandomTensors(n=32, shape=(8,), num_classes=16, seed=7)
    x, y = map(torch.stack, zip(*[(a, torch.as_tensor(b)) for a, b in (held[i] for i in range(32))], strict=True))
    for name, where in (("cache", {}), ("live", {"from": None, "capture": None, "at": "0"})):
        run_cfg = train(path, tmp_path / name, "p/0/output.0", evaluate={"data": {"dataset": HELD_OUT}})
        run_cfg["sae"].update(where)
        run_cfg.update(loss=loss)
        (tmp_path / name).mkdir()
        result = hookrun.run(run_cfg, model=model, dataset=Items(classes=2))
        with hookrun.open_run(result.path) as r:
            got = r.sae_evaluation["model"]
        sae = sae_lens.SAE.load_from_disk(str(tmp_path / name / "p_0_output.0"))
        with torch.no_grad():
            clean = F.cross_entropy(model(x), y)
            handle = model[0].register_forward_hook(lambda m, i, o, sae=sae: (sae.decode(sae.encode(o[0])), o[1]))
            spliced = F.cross_entropy(model(x), y)
            handle.remove()
        assert got["ce_clean"] == pytest.approx(float(clean), rel=1e-5)
        assert got["ce_intervened"] == pytest.approx(float(spliced), rel=1e-5)
        assert abs(float(spliced) - float(clean)) > 1e-4  # (the splice acted)
