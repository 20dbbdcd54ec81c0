"""evaluate and patching are kind plugins: their blocks live in their folders (the schema and
conf/config.yaml name neither), each block is typed and checked once per run, and their command-line
keys and resumes of files that stored them as nulls keep working.

References: the model called directly (ce by torch's cross_entropy), TransformerLens' own patching
function (the grid), the block's own keys (the errors); the counts are of the plugin parser's calls.
"""

from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
import yaml
from conftest import ROOT
from torch import nn

import hookrun
from hookrun.config import load, plugins
from hookrun.config.schema import HookrunConfig
from hookrun.errors import ConfigError
from hookrun.runner.kinds.user_kind import plugin_kind

MOVED = ("evaluate", "patching")


def test_the_schema_and_the_primary_config_name_neither_block():
    assert not {f.name for f in dataclasses.fields(HookrunConfig)} & set(MOVED)
    top = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    assert not set(top) & set(MOVED)
    for name in MOVED:
        kind = plugins.plugin(name)
        assert kind is not None and kind.block_class().__module__.startswith(f"hookrun.runner.kinds.{name}.")
        assert plugin_kind(kind).block == name and kind.reader_object().kind == name


def counting(monkeypatch) -> list[str]:
    """The names of the blocks plugins.typed_block parses (load() calls it through plugins.typed_blocks)."""
    seen: list[str] = []
    real = plugins.typed_block

    def typed(name, node):
        seen.append(name)
        return real(name, node)

    monkeypatch.setattr(plugins, "typed_block", typed)
    return seen


def test_an_evaluate_run_parses_its_block_once_and_its_ce_is_the_models(tmp_path, monkeypatch):
    seen = counting(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    g = torch.Generator().manual_seed(1)
    ds = torch.utils.data.TensorDataset(torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g))
    hooks = {"s": {"at": "0", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.5}]}}
    cfg = {"hooks": hooks, "device": "cpu", "progress": False, "evaluate": {"ablation": "zero"},
           "data": {"batch_size": 3}, "loss": {"_target_": "torch.nn.functional.cross_entropy", "_partial_": True},
           "output": {"path": str(tmp_path / "e.h5")}}
    path = hookrun.run(cfg, model=model, dataset=ds).path
    assert seen == ["evaluate"]  # typed and checked once, in load()
    x, y = ds.tensors
    with torch.no_grad():
        clean = [float(F.cross_entropy(model(x[i:i + 3]), y[i:i + 3])) for i in (0, 3)]
        h = model[0].register_forward_hook(lambda m, i, o: torch.zeros_like(o))
        ablated = [float(F.cross_entropy(model(x[i:i + 3]), y[i:i + 3])) for i in (0, 3)]
        h.remove()
    with h5py.File(path) as f:
        assert f.attrs["kind"] == "evaluate"
        np.testing.assert_allclose(f["evaluation/model/ce_clean"][:], clean, rtol=1e-6)
        np.testing.assert_allclose(f["evaluation/model/ce_ablated"][:], ablated, rtol=1e-6)
        stored = yaml.safe_load(f.attrs["config"])
    assert stored["evaluate"] == {"enabled": True, "ablation": "zero", "mean": None}


def test_a_patching_run_parses_and_checks_its_block_once(tmp_path, monkeypatch):
    tl = pytest.importorskip("transformer_lens")
    from tl_models import hooked_transformer

    from hookrun.runner.kinds.patching import block as patching_block

    seen = counting(monkeypatch)
    checked: list[int] = []
    real = patching_block.parse_block
    monkeypatch.setattr(patching_block, "parse_block", lambda *a, **k: checked.append(1) or real(*a, **k))
    model = hooked_transformer(40)
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 40, (3, 5), generator=g)
    corrupt = clean.clone()
    corrupt[:, 1] = torch.randint(0, 40, (3,), generator=g)
    items = [{"clean": clean[i], "corrupt": corrupt[i], "answer": torch.tensor(3), "wrong": torch.tensor(4)} for i in range(3)]
    site = {"at": "blocks.*.hook_resid_pre", "over": ["position"]}
    cfg = {"data": {"inputs": {"input": "clean"}, "target": None}, "progress": False,
           "output": {"path": str(tmp_path / "p.h5")},
           "patching": {"input": "input", "sites": {"resid": site}, "metric": {"_target_": "patch_metrics.last_logit"}}}
    hookrun.run(cfg, model=model, dataset=items)
    assert seen == ["patching"] and len(checked) == 1  # typed once, its Block checked once
    _, cache = model.run_with_cache(clean)
    want = tl.patching.get_act_patch_resid_pre(model, corrupt, cache, lambda lg: lg[:, -1, 1].mean()).numpy()
    np.testing.assert_allclose(hookrun.open_run(tmp_path / "p.h5").grid("resid").values, want, atol=1e-4)


@pytest.mark.parametrize(("block", "line"), [
    ({"evaluate": {"ablaton": "zero"}}, "evaluate.ablaton: not a key of the evaluate block; did you mean evaluate.ablation?"),
    ({"patching": {"methd": "atp"}}, "patching.methd: not a key of the patching block; did you mean patching.method?"),
    ({"patching": {"method": "nope", "sites": {"r": "x"}}}, "patching.method='nope'; choose from: "),
    ({"patching": {"method": "eap_gi"}}, "patching.method='eap_gi'; choose from: atp, atp_ig, eap, eap_ig, exact; "
                                         "did you mean eap_ig?"),
    ({"patching": {"verify": "many"}}, "patching.verify=many is not a whole number; give an integer"),
    # a key of a block nested in a block: was OmegaConf's "probe.split.tset: Key 'tset' not in 'Split'", no close key
    ({"probe": {"at": ["fc"], "split": {"tset": 0.3}}}, "probe.split.tset: not a key of probe.split; did you mean "
                                                        "probe.split.test? (it has: seed, test)"),
    ({"similarity": {"at": ["fc"], "with": {"model": {"_target_": "x"}, "att": ["fc"]}}},  # (named no close key)
     "similarity.with.att: not a key of with; did you mean similarity.with.at? (it has: model, at)"),
    ({"similarity": {"at": ["fc"], "with": {"data": {}}}}, "similarity.with.data: not a key of with (the second model "
                                                          "runs on the run's own batches); it has: model, at"),
])
def test_a_bad_key_or_value_of_either_block_is_one_line_at_load(block, line):
    with pytest.raises(ConfigError) as exc:
        load({"model": {"_target_": "x"}, "data": {"dataset": {"_target_": "x"}}, **block})
    assert str(exc.value).startswith(line) and "\n" not in str(exc.value)


def test_a_key_of_evaluate_on_the_command_line_adds_the_block_and_patching_keys_need_one():
    from hookrun.cli.compose import compose_config

    cfg = load(compose_config(["evaluate.ablation=zero", "loss=cross_entropy"]))
    assert cfg.evaluate.ablation == "zero" and cfg.evaluate.enabled is True and cfg.patching is None
    assert load(compose_config([])).evaluate is None  # no block given: the kind is off, nothing of it parsed
    with pytest.raises(ConfigError, match=r"^patching.method=atp: this config has no patching block; add one with"):
        compose_config(["patching.method=atp"])
    grid = load(compose_config(["experiment=patching_grid", "patching.method=atp", "patching.verify=2"]))
    assert (grid.patching.method, grid.patching.verify) == ("atp", 2) and grid.evaluate is None


def test_a_file_that_stored_the_blocks_as_nulls_resumes_under_a_config_without_them():
    from hookrun.config.differing import config_differences

    new = {"device": "cpu", "data": {"batch_size": 4, "limit": None}, "output": {"path": "a.h5"}}
    old = {**new, "evaluate": {"enabled": None, "ablation": None, "mean": None}, "patching": None}
    assert config_differences(old, new) == []
    assert config_differences({**old, "evaluate": {"enabled": None, "ablation": "zero", "mean": None}}, new) == [
        "evaluate (only in the file's run: {ablation: zero}; add '+evaluate={ablation: zero}')"]  # (the whole block)
    assert config_differences(old, {**new, "data": {"batch_size": 8}}) == ["data.batch_size"]
