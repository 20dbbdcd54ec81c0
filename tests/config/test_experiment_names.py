"""Names that say what runs (issue 47 item 5): experiment=attribution_patching is attribution
patching (the old name experiment=attribution still runs, saying once that it was renamed); an
edges or patching experiment on a model without token inputs, or with another data group, is one
line naming the model's inputs and what patching needs. References: the renamed file's own config
composed under its new name; the model's forward signature read with inspect."""

from __future__ import annotations

import inspect

import pytest
import torchvision
from conftest import ENV, run_cli

import hookrun
from hookrun.errors import ConfigError


def test_the_old_name_composes_the_new_one_and_says_so(tmp_path):
    with pytest.warns(UserWarning, match="experiment=attribution was renamed experiment=attribution_patching"):
        old = hookrun.compose("experiment=attribution", f"hydra.run.dir={tmp_path}")
    new = hookrun.compose("experiment=attribution_patching", f"hydra.run.dir={tmp_path}")
    assert old == new and new["patching"]["method"] == "atp"


@pytest.mark.slow
def test_the_old_name_runs_on_the_command_line_with_one_note(tmp_path):
    done = run_cli("experiment=attribution", "dry_run=true", "data.dataset.n=2", "device=cpu", "progress=false",
                   cwd=tmp_path, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("renamed experiment=attribution_patching") == 1


@pytest.mark.parametrize("overrides, model_takes", [
    (["experiment=edges", "model=resnet18", "model.num_classes=4"], "ResNet.forward takes x"),
    (["experiment=patching_grid", "model=tiny_cnn"], "TinyCNN.forward takes x"),
])
def test_patching_on_a_model_without_token_inputs_names_its_inputs(tmp_path, overrides, model_takes):
    cfg = hookrun.compose(*overrides, "data.dataset.n=2", "device=cpu", "progress=false", f"output.path={tmp_path / 'x.h5'}")
    model_cls = torchvision.models.ResNet if "resnet18" in overrides[1] else None
    if model_cls is not None:  # the reference: the forward's own arguments
        assert list(inspect.signature(model_cls.forward).parameters)[1:] == ["x"]
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg)
    line = str(err.value)
    assert "\n" not in line and line.startswith("patching.input='input_ids': ") and model_takes in line
    assert "token ids for a language model" in line and "data.inputs=" not in line
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.slow
@pytest.mark.parametrize("data", ["shapes", "text"])
def test_an_edges_experiment_with_another_data_group_is_one_line(tmp_path, data):
    done = run_cli("experiment=edges", f"data={data}", "device=cpu", "progress=false", "hydra.run.dir=run",
                   cwd=tmp_path, env=ENV)
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("hookrun:")]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "GPT2LMHeadModel.forward takes input_ids" in lines[0]  # the model's inputs
    assert "sends each item's 'clean' and 'corrupt'" in lines[0] and "drop it" in lines[0]  # what patching needs
    assert not (tmp_path / "run").exists()
