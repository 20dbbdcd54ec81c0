"""Bad input is one line naming what is wrong and what would be right: bad values, blocklisted
targets, patch sources, batches that do not fit the forward, a loss that does not fit the output.
References: the raw model, plain h5py, and the CLI's own exit code and stderr."""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
import warm_python
from conftest import ROOT, make_cfg
from h5_damage import damage_object_header
from toy_runs import lin_cfg, toy_cfg

import hookrun
from hookrun.errors import ConfigError


@pytest.mark.parametrize("over, message", [
    ({"output.path": "x" * 300 + ".h5"}, r"output.path: the name 'x+'... is too long \(303 bytes; file systems allow 255 bytes in a name\)"),
    ({"data.batch_size": 2**70}, r"data.batch_size must be at least 1 and at most \d+, got 1180591620717411303424"),
    ({"seed": 2**70}, r"seed: 1180591620717411303424 is out of range; use a whole number from 0 to 18446744073709551615"),
    ({"output.path": "."}, r"output.path: '.*' is a folder; give a file path"),
    ({"output.path": "new/"}, r"output.path: '.*new/' ends in '/', a folder; give a file path such as .*new/captures.h5"),
])
def test_bad_values_get_one_line(tmp_path, over, message):
    over = {k: f"{tmp_path}/{v}" if k == "output.path" else v for k, v in over.items()}
    with pytest.raises(ConfigError, match=message):
        hookrun.run(toy_cfg(tmp_path, **over))


def test_a_blocklisted_target_gets_the_whole_sentence(tmp_path):
    cfg = toy_cfg(tmp_path)
    cfg["model"] = {"_target_": "builtins.eval"}
    with pytest.raises(ConfigError, match=r"model: Target 'builtins.eval' is blocklisted because it allows config data "
                                          r"to control executable behavior .* HYDRA_INSTANTIATE_ALLOWLIST_OVERRIDE\.$"):
        hookrun.run(cfg)


def _clean(tmp_path, checkpoint):
    hooks = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    return hookrun.run(make_cfg(tmp_path / "clean", checkpoint, hooks)).path


def _patch(source):
    return {"p": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", "op": "patch", "source": str(source)}]}}


def test_a_damaged_patch_source_is_one_line_naming_the_file_and_the_capture(tmp_path, checkpoint):
    clean = _clean(tmp_path, checkpoint)
    damage_object_header(clean, "captures/l/layer2/output")
    with pytest.raises(ConfigError, match=r"patch source .*clean/captures\.h5.* (capture|captures/l/layer2).*damaged"):
        hookrun.run(make_cfg(tmp_path, checkpoint, _patch(clean)))
    assert not (tmp_path / "captures.h5").exists()


def test_a_patch_source_that_is_the_output_path_is_refused_before_anything_is_opened(tmp_path, checkpoint):
    clean = _clean(tmp_path, checkpoint)
    before = clean.read_bytes()
    cfg = make_cfg(tmp_path, checkpoint, _patch(clean), **{"output.path": str(clean), "output.overwrite": True})
    with pytest.raises(ConfigError, match=r"output\.path .* is the patch source of hooks\.p"):
        hookrun.run(cfg)
    assert clean.read_bytes() == before  # the clean run is as it was


def test_a_patch_source_folder_without_a_run_names_the_file_it_looked_for(tmp_path, checkpoint):
    """A folder that holds no run was said not to exist, although it does."""
    (tmp_path / "clean").mkdir()
    with pytest.raises(ConfigError, match=r"patch source '.*clean': no file '.*clean/captures\.h5' \(run the clean run first"):
        hookrun.run(make_cfg(tmp_path, checkpoint, _patch(tmp_path / "clean")))


@pytest.mark.slow
def test_inspect_of_a_file_without_config_says_what_is_missing(tmp_path, checkpoint):
    path = _clean(tmp_path, checkpoint)
    with h5py.File(path, "a") as f:
        for key in ("config", "model_class", "device", "steps_complete", "samples_complete"):
            del f.attrs[key]
    proc = warm_python.run_module("hookrun.inspect", [str(path), "--no-stats"], cwd=ROOT, env=dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "None" not in proc.stdout
    assert "12 samples" in proc.stdout  # counted from /samples/index
    assert "  missing   config, model_class, device, steps_complete, samples_complete" in proc.stdout


class TakesX(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x)


class DictItems(torch.utils.data.Dataset):
    def __init__(self, target_none: bool = False) -> None:
        self.x, self.none = torch.randn(6, 4), target_none

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        return {"image": self.x[i], "label": None if self.none else i % 3}


def test_dict_keys_that_are_not_the_forwards_arguments_name_the_mapping(tmp_path):
    with pytest.raises(ConfigError, match=r"items' keys \(image; target label\) .* TakesX\.forward takes x, not image; "
                                          r"map them with data.inputs='\{x: image\}'"):
        hookrun.run(lin_cfg(tmp_path), model=TakesX(), dataset=DictItems())
    assert not (tmp_path / "c.h5").exists()
    cfg = lin_cfg(tmp_path)
    cfg["data"]["inputs"] = {"x": "image"}  # the line the message gives works
    ds = DictItems()
    path = hookrun.run(cfg, model=TakesX(), dataset=ds).path
    with h5py.File(path) as f, torch.no_grad():
        np.testing.assert_allclose(f["captures/r/lin/output"][:], TakesX()(ds.x).numpy(), rtol=1e-6)


class KwModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, input_ids, attention_mask):
        return self.emb(input_ids) * attention_mask.unsqueeze(-1)


class FeatureDictAndLabel(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([i, i + 1, 2]), "attention_mask": torch.tensor([1, 1, 0])}, i % 2


def test_a_feature_dict_with_a_label_is_spread_as_keyword_arguments(tmp_path):
    hooks = {"e": {"at": "emb", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = lin_cfg(tmp_path, hooks=hooks)
    path = hookrun.run(cfg, model=KwModel(), dataset=FeatureDictAndLabel()).path
    ids = torch.stack([FeatureDictAndLabel()[i][0]["input_ids"] for i in range(4)])
    with h5py.File(path) as f, torch.no_grad():
        np.testing.assert_array_equal(f["captures/e/emb/output"][:], KwModel().emb(ids).numpy())
        np.testing.assert_array_equal(f["samples/target"][:], [0, 1, 0, 1])


def test_a_none_target_is_exit_2_naming_the_dataset_and_the_target(tmp_path):
    cfg = lin_cfg(tmp_path)
    cfg["data"]["inputs"] = {"x": "image"}
    with pytest.raises(ConfigError, match=r"data\.target: .* None.*data\.dataset.*data\.target=null") as info:
        hookrun.run(cfg, model=TakesX(), dataset=DictItems(target_none=True))
    assert info.value.exit_code == 2


def test_cross_entropy_on_token_logits_names_both_shapes_and_loss_lm(tmp_path):
    class TokenLogits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 5)

        def forward(self, x):
            return self.lin(x).unsqueeze(1).expand(-1, 3, -1)  # (B, T, V)

    data = torch.utils.data.TensorDataset(torch.randn(4, 4), torch.zeros(4, dtype=torch.long))
    cfg = lin_cfg(tmp_path, mode="grad", loss={"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True})
    with pytest.raises(hookrun.errors.RunError, match=r"logits of shape \(2, 3, 5\) do not fit targets of shape \(2,\).*loss=lm"):
        hookrun.run(cfg, model=TokenLogits(), dataset=data)


@pytest.mark.slow
def test_an_error_inside_the_models_forward_is_one_line_with_the_call(tmp_path):
    pytest.importorskip("transformers")
    cmd = [sys.executable, "-m", "hookrun", "model=hf", "model.model_class=T5ForConditionalGeneration",
           "~model.config", "+model.config={num_layers: 1, num_decoder_layers: 1, d_model: 16, d_ff: 32, num_heads: 2, d_kv: 8, "
           "vocab_size: 300, decoder_start_token_id: 0}", "data=text", "data.limit=1", f"hydra.run.dir={tmp_path}",
           "hooks={h: {at: encoder, type: forward, actions: [record]}}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert any("the model's forward failed: T5ForConditionalGeneration(input_ids=[" in ln and "ValueError" in ln
               for ln in err), proc.stderr[-2000:]


def test_grad_without_a_loss_lists_loss_lm(tmp_path, checkpoint):
    with pytest.raises(ConfigError, match=r"mode=grad needs a loss: .*loss=lm"):
        hookrun.run(make_cfg(tmp_path, checkpoint, None, mode="grad"))


def test_a_hook_without_type_names_the_keys_it_needs_and_not_actions(tmp_path):
    """It said "a hook needs actions, at, type", though actions is optional ([record] by default)."""
    with pytest.raises(ConfigError, match=r"^hooks\.f\.type is missing; a hook needs at and type \(actions is optional: "
                                          r"\[record\] by default\)$"):
        hookrun.run(toy_cfg(tmp_path, hooks={"f": {"at": "body"}}))


def test_an_output_key_on_a_model_returning_one_tensor_names_the_key(tmp_path):
    """It said "cannot use the model's output, a Tensor; give loss=custom ..." and never named output_key."""
    from hookrun.runner.losses import cross_entropy

    logits, target = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    with pytest.raises(hookrun.errors.RunError, match=r"^loss=cross_entropy: loss.output_key='foo', but the model returns "
                                                      r"one tensor, which has no keys or positions; remove loss.output_key$"):
        cross_entropy(logits, target, output_key="foo")
    torch.testing.assert_close(cross_entropy(logits, target), torch.nn.functional.cross_entropy(logits, target))


@pytest.mark.parametrize("override, line", [
    ("progress=maybe", "progress=maybe is not a boolean; give true or false"),
    ("data.batch_size=1.5", "data.batch_size=1.5 is not a whole number; give an integer"),
    ("probe.C=abc", "probe.C=abc is not a number; give one such as 0.5"),
    ("probe.control=maybe", "probe.control=maybe is not a boolean; give true or false"),
])
def test_a_value_of_another_type_names_what_to_give_on_the_command_line(tmp_path, override, line):
    """OmegaConf's "Value 'maybe' is not a valid bool (type str)" named the value, not what it should be."""
    proc = warm_python.run_module("hookrun", ["experiment=probe_shapes", override, f"hydra.run.dir={tmp_path / 'run'}"],
                                  cwd=ROOT, env=dict(os.environ), timeout=300)
    assert (proc.returncode, proc.stderr.strip().splitlines()[-1]) == (2, f"hookrun: error: {line}"), proc.stderr
    assert not (tmp_path / "run" / "captures.h5").exists()


@pytest.mark.parametrize("over, line", [
    ({"data": {"batch_size": "abc"}}, "data.batch_size=abc is not a whole number; give an integer"),
    ({"probe": {"at": ["fc1"], "target": 1, "max_iter": 1.5}}, "probe.max_iter=1.5 is not a whole number; give an integer"),
    ({"probe": {"at": ["fc1"], "target": 1, "split": {"seed": True}}}, "probe.split.seed=True is not a whole number; give an integer"),
])
def test_a_value_of_another_type_names_what_to_give_from_python(tmp_path, over, line):
    with pytest.raises(ConfigError) as caught:
        hookrun.run({**toy_cfg(tmp_path), **over})
    assert str(caught.value) == line
