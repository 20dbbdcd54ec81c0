"""Reliability, round 3 (issue 23): each defect's case, which failed before its fix. References:
plain h5py, the raw model, and the CLI's own exit code and stderr."""

from __future__ import annotations

import logging
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT, make_cfg, small_resnet

import hookrun
from hookrun.errors import ConfigError


def _clean(tmp_path, checkpoint):
    hooks = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    return hookrun.run(make_cfg(tmp_path / "clean", checkpoint, hooks)).path


def _patch(source):
    return {"p": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", "op": "patch", "source": str(source)}]}}


def _damage_object_header(path, name):
    """Overwrite the first bytes of a dataset's object header, as a bad disk block would."""
    with h5py.File(path, "r") as f:
        addr = h5py.h5o.get_info(f[name].id).addr
    with open(path, "r+b") as raw:
        raw.seek(addr)
        raw.write(b"\xff" * 16)


# -- 1. a corrupted patch source ---------------------------------------------------------------------
def test_a_damaged_patch_source_is_one_line_naming_the_file_and_the_capture(tmp_path, checkpoint):
    clean = _clean(tmp_path, checkpoint)
    _damage_object_header(clean, "captures/l/layer2/output")
    with pytest.raises(ConfigError, match=r"patch source .*clean/captures\.h5.* (capture|captures/l/layer2).*damaged"):
        hookrun.run(make_cfg(tmp_path, checkpoint, _patch(clean)))
    assert not (tmp_path / "captures.h5").exists()


# -- 2. a patch source that is the run's own output --------------------------------------------------
def test_a_patch_source_that_is_the_output_path_is_refused_before_anything_is_opened(tmp_path, checkpoint):
    clean = _clean(tmp_path, checkpoint)
    before = clean.read_bytes()
    cfg = make_cfg(tmp_path, checkpoint, _patch(clean), **{"output.path": str(clean), "output.overwrite": True})
    with pytest.raises(ConfigError, match=r"output\.path .* is the patch source of hooks\.p"):
        hookrun.run(cfg)
    assert clean.read_bytes() == before  # the clean run is as it was


# -- 7. hookrun.capture says when a hook never fired ----------------------------------------------------
def test_capture_warns_about_a_hook_that_never_fired(reference_model, caplog):
    hooks = {"f": {"at": "layer1.0", "type": "forward", "actions": ["record"]}}
    reference_model.layer1[0].forward = lambda x: x  # noqa: ARG005  (never runs its children)
    hooks["g"] = {"at": "layer1.0.conv1", "type": "forward", "actions": ["record"]}
    with caplog.at_level(logging.WARNING, logger="hookrun"), torch.no_grad(), hookrun.capture(reference_model, hooks):
        reference_model(torch.zeros(1, 3, 32, 32))
    assert "hook 'g' never fired: module 'layer1.0.conv1' did not run in the block" in caplog.text
    assert "hook 'f'" not in caplog.text


# -- 8. inspect of a file without a config attribute ------------------------------------------------
@pytest.mark.slow
def test_inspect_of_a_file_without_config_says_what_is_missing(tmp_path, checkpoint):
    path = _clean(tmp_path, checkpoint)
    with h5py.File(path, "a") as f:
        for key in ("config", "model_class", "device", "steps_complete", "samples_complete"):
            del f.attrs[key]
    proc = subprocess.run([sys.executable, "-m", "hookrun.inspect", str(path), "--no-stats"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "None" not in proc.stdout
    assert "12 samples" in proc.stdout  # counted from /samples/index
    assert "  missing   config, model_class, device, steps_complete, samples_complete" in proc.stdout


# -- 6. run(cfg, model=m) gives the model back as it went in ------------------------------------------
def test_run_with_a_live_model_restores_its_mode_and_flags(tmp_path, checkpoint, dataset):
    model = small_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.train()
    model.layer1[0].relu.inplace = True
    before = {n: (m.training, getattr(m, "inplace", None)) for n, m in model.named_modules()}
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    hooks = {"g": {"at": "layer1", "type": "tensor", "actions": ["record"]}}
    cfg = {"data": {"batch_size": 4}, "device": "cpu", "mode": "grad", "progress": False, "hooks": hooks,
           "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True},
           "output": {"path": str(tmp_path / "c.h5")}}
    hookrun.run(cfg, model=model, dataset=dataset)
    assert {n: (m.training, getattr(m, "inplace", None)) for n, m in model.named_modules()} == before
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grads
    assert all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    with h5py.File(tmp_path / "c.h5") as f:
        assert np.isfinite(f["captures/g/layer1/grad"][:]).all()
