"""A kind's block from the command line (issue 47 item 3): `+attribution={...}`, `+attribution.KEY=...`
and `attribution={...}` add the block and run; `attribution.method=...` / `patching.method=...` on a
config without the block are one line naming the block and how to add it, exit 2. The mechanism is
generic: a kind plugin's null slot (a block that is not a key of conf/config.yaml) behaves the same.
References: saliency by torch.autograd.grad on the same model and images; OmegaConf on the raw schema."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from conftest import ENV, run_cli
from omegaconf import OmegaConf

import hookrun
from hookrun.cli.app import conf_dir
from hookrun.cli.around_hydra import block_names, hydra_slots, missing_block
from hookrun.cli.override_faults import experiments_with
from hookrun.cli.usage import usage
from hookrun.config.schema import HookrunConfig
from hookrun.errors import ConfigError

SMALL = ["model=tiny_cnn", "data=shapes", "data.dataset.size=4", "data.batch_size=2", "device=cpu", "progress=false"]


def one_line(proc) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("hookrun: error: "), proc.stderr[-2000:]
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("form", ["+attribution={method: saliency}", "+attribution.method=saliency",
                                  "attribution={method: saliency}"])
def test_an_added_attribution_block_runs_and_gives_the_gradient(tmp_path, form):
    done = run_cli(*SMALL, form, "hydra.run.dir=run", cwd=tmp_path, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    a = hookrun.open_run(tmp_path / "run" / "captures.h5").attribution()
    from hookrun.data.shapes import shapes
    from hookrun.models.tiny_cnn import tiny_cnn

    model = tiny_cnn().eval()
    items = [shapes(4, 32, 0)[i] for i in range(4)]
    x = torch.stack([torch.as_tensor(img) for img, _ in items]).requires_grad_(True)
    labels = torch.tensor([int(y) for _, y in items])
    (grad,) = torch.autograd.grad(model(x)[torch.arange(4), labels].sum(), x)
    np.testing.assert_array_equal(a["target"].values, labels.numpy())
    np.testing.assert_allclose(a.values, grad.abs().numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("override, block, add", [
    ("attribution.method=saliency", "attribution", "'+attribution={method: saliency}'"),
    ("patching.method=eap", "patching", "'+patching={method: eap}'"),
    ("patching.metric.name=logit_diff", "patching", "'+patching.metric.name=logit_diff'"),
])
def test_setting_a_key_of_a_block_the_config_lacks_says_how_to_add_it(tmp_path, override, block, add):
    line = one_line(run_cli("experiment=resnet_layer1", override, "hydra.run.dir=run", cwd=tmp_path, env=ENV))
    assert line.startswith(f"hookrun: error: {override}: this config has no {block} block; add one with {add}")
    assert "experiment=" in line and "NoneType" not in line
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=f"this config has no {block} block"):  # the same in Python
        hookrun.compose("experiment=resnet_layer1", override)


@pytest.mark.slow
def test_a_block_the_experiment_has_takes_a_plain_key(tmp_path):
    done = run_cli("experiment=attribution_shapes", "attribution.method=saliency", "attribution.measure=null",
                   "data.dataset.size=2", "data.batch_size=2", "device=cpu", "progress=false", "hydra.run.dir=run",
                   cwd=tmp_path, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    assert hookrun.open_run(tmp_path / "run" / "captures.h5").attrs["kind"] == "attribution"


@pytest.mark.slow
def test_a_wrong_key_inside_an_added_block_is_one_line(tmp_path):
    line = one_line(run_cli(*SMALL, "+attribution={methd: saliency}", cwd=tmp_path, env=ENV))
    assert "attribution.methd" in line and "did you mean attribution.method" in line


@pytest.mark.slow
def test_a_key_of_a_plugin_that_fails_to_load_is_the_same_one_line_as_adding_its_block(tmp_path):
    """`brk.factor=2` (no +) asks the kind whether a key adds its block (`added_by_key`), before the
    error handler: a package failing on an import of its own was its traceback, exit 1."""
    site = tmp_path / "site"
    (site / "userkind_brk").mkdir(parents=True)
    (site / "userkind_brk/__init__.py").write_text("import nonexistent_dependency_xyz\n")
    (site / "userkind_brk-0.1.dist-info").mkdir()
    (site / "userkind_brk-0.1.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: userkind_brk\nVersion: 0.1\n")
    (site / "userkind_brk-0.1.dist-info/entry_points.txt").write_text("[hookrun.kinds]\nbrk = userkind_brk:KIND\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(site), ENV["PYTHONPATH"]])}
    lines = [one_line(run_cli(*SMALL, override, "hydra.run.dir=run", cwd=tmp_path, env=env))
             for override in ("brk.factor=2", "+brk={factor: 2}")]
    assert lines[0] == lines[1] == (
        "hookrun: error: the kind plugin 'brk' (entry point 'brk' of hookrun.kinds (userkind_brk:KIND)) fails to "
        "load: ModuleNotFoundError: No module named 'nonexistent_dependency_xyz'")
    assert not (tmp_path / "run").exists()


def test_a_plugins_null_slot_behaves_as_the_shipped_blocks():
    """A kind plugin's block is an untyped null slot beside hookrun's fields (not a key of
    conf/config.yaml): it is a block, and a key of it set without + is refused the same way."""
    from hookrun.config.schema import hydra_schema, plugin_names

    schema = hydra_slots(hydra_schema())  # the schema the CLI composes onto: a null slot per kind plugin
    assert block_names(schema, HookrunConfig) == plugin_names()
    assert {"attribution", "evaluate", "patching", "probe", "similarity"} <= set(plugin_names())
    cfg = OmegaConf.structured(schema)
    for key in ("patching.method", "attribution.method", "probe.layer"):
        OmegaConf.update(cfg, key, "x", merge=True)
    assert cfg.patching == {"method": "x"} and cfg.probe == {"layer": "x"}
    composed = OmegaConf.structured(schema)
    line = missing_block(["probe.layer=3"], block_names(schema, HookrunConfig), lambda: composed, conf_dir())
    assert line.startswith("probe.layer=3: this config has no probe block; add one with '+probe={layer: 3}'")
    assert missing_block(["+probe={layer: 3}", "probe.layer=4"], ["probe"], lambda: composed, ".") is None
    assert missing_block(["seed=1"], ["probe"], lambda: 1 / 0, ".") is None  # nothing composed where no block is set
    swept = ["experiment=attribution_shapes,resnet_layer1"]  # Hydra composes a sweep's config first without them
    line = missing_block([*swept, "attribution.method=saliency"], ["attribution"], lambda: composed, ".", swept)
    assert line.endswith("write '++attribution.method=saliency' (it sets the key where a job has the block, and adds it elsewhere)")


def test_experiments_with_a_block_and_the_help():
    conf = conf_dir()
    assert {"edges", "patching_grid"} <= set(experiments_with("patching", conf))
    assert "resnet_layer1" not in experiments_with("patching", conf)
    assert "'+KIND={KEY: VALUE, ...}'" in usage(conf) and "experiment=attribution_patching, edges" in usage(conf)
