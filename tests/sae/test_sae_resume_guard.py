"""What resume=true may take over: the SAE in sae.out only where it is the resumed run's own, and the
cache only where it is the one the run started on. References: the SAE file's bytes (hashlib) and the
caches' own `created` attributes read with h5py."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import h5py
import pytest
import torch
from sae_kill_at_step import interrupt_at_step
from test_sae_kind import check_equals_reference, config
from test_sae_train import CAPTURE, make_cache

import hookrun
from hookrun.errors import ConfigError
from hookrun.output.process import Interrupted

pytest.importorskip("sae_lens")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return make_cache(tmp_path_factory.mktemp("guard_cache"))


def other_cache(folder: Path) -> str:
    """make_cache's 400 rows, from other random inputs (data seed 4)."""
    cfg = {"model": {"_target_": "torchvision.ops.MLP", "in_channels": 8, "hidden_channels": [16]},
           "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": 400, "shape": [8],
                                "num_classes": 2, "seed": 4}, "batch_size": 50},
           "device": "cpu", "progress": False, "output": {"path": str(folder / "captures.h5")},
           "hooks": {"mlp": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}}
    return str(hookrun.run(cfg).path)


def small(cache: str, folder: Path, **sae) -> dict:
    return config(cache, folder, rows=128, lr_schedule={"warmup": 1}, **sae)


def sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def test_resume_on_a_new_run_folder_never_replaces_another_runs_sae(cache, tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "saes" / "keep"
    hookrun.run(small(cache, tmp_path / "a", out=str(out)))
    before = sha1(out / "sae_weights.safetensors")
    with pytest.raises(ConfigError) as info:  # a new folder: nothing to resume, another run's SAE in out
        hookrun.run({**small(cache, tmp_path / "b", out=str(out), d_sae=32), "resume": True})
    msg = str(info.value)
    assert "\n" not in msg and str(out) in msg and "sae.overwrite=true" in msg and "no SAE run" in msg
    assert sha1(out / "sae_weights.safetensors") == before
    assert not (tmp_path / "b" / "captures.h5").exists()
    # the run that wrote it: resume=true of a complete run does nothing, and is not refused
    again = hookrun.run({**small(cache, tmp_path / "a", out=str(out)), "resume": True})
    assert again.status == "complete" and sha1(out / "sae_weights.safetensors") == before


def test_resume_on_another_cache_at_the_same_path_is_refused(tmp_path, monkeypatch, sigint_default):
    from hookrun.output.process import Interrupted
    from hookrun.runner.kinds.sae import engine

    torch.set_num_threads(1)
    cache = make_cache(tmp_path / "cache")
    cfg = small(cache, tmp_path / "run")
    cfg["output"]["flush_every"] = 1
    step = interrupt_at_step(monkeypatch, 2)  # (Ctrl-C after step 2)
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    monkeypatch.setattr(engine.LoggingTrainer, "step", step)
    with h5py.File(cache) as f:
        was = f["captures/" + CAPTURE][:]
    shutil.rmtree(tmp_path / "cache")  # another cache recorded at the same path, with as many rows
    other_cache(tmp_path / "cache")
    with h5py.File(cache) as f:
        now = f["captures/" + CAPTURE][:]
    assert was.shape == now.shape and not (was == now).all()
    with pytest.raises(ConfigError) as info:
        hookrun.run({**cfg, "resume": True})
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"resume: sae.from {cache} is not the cache") and "digest" in msg
    with h5py.File(tmp_path / "run" / "captures.h5") as f:  # the interrupted file is as it was
        assert f.attrs["status"] == "interrupted"


def test_two_runs_in_one_folder_keep_their_own_checkpoints_and_sae(cache, tmp_path, monkeypatch, sigint_default):
    """Run A (a.h5) stopped after step 13 with checkpoints; run B (b.h5, another lr and seed) ran in the
    same folder. B removed A's checkpoints and wrote its own in the shared checkpoints/, and A's resume
    took B's checkpoint (mse 4.9 off SAELens' at the end). Reference: SAELens' trainer run directly with
    A's settings (check_equals_reference)."""
    from hookrun.runner.kinds.sae import engine

    torch.set_num_threads(1)
    run = tmp_path / "run"
    cfg_a = config(cache, run, checkpoints=3)
    cfg_a["output"].update(path=str(run / "a.h5"), flush_every=1)
    step = interrupt_at_step(monkeypatch, 13)
    with pytest.raises(Interrupted):
        hookrun.run(cfg_a)
    monkeypatch.setattr(engine.LoggingTrainer, "step", step)
    cfg_b = config(cache, run, checkpoints=3, lr=1e-2, seed=7)
    cfg_b["output"]["path"] = str(run / "b.h5")
    assert hookrun.run(cfg_b).status == "complete"
    assert sorted(p.name for p in (run / "a.checkpoints").iterdir()) == ["192", "352"]  # A's, untouched
    assert sorted(p.name for p in (run / "b.checkpoints").iterdir()) == ["192", "352", "512"]
    result = hookrun.run({**cfg_a, "resume": True})
    assert result.status == "complete"
    check_equals_reference(result.path, run / "a.sae", cache)
    assert (run / "b.sae" / "sae_weights.safetensors").exists()  # B's SAE, not replaced by A's
