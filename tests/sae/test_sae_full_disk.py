"""A full disk while the sae kind writes its SAE folder or a checkpoint (a fault injected where SAELens
writes: part of the file written, then ENOSPC as a full disk gives it): one RunError line after the
steps, no cut-off SAE left in `sae.out` (nor a cut-off checkpoint folder), and `resume=true` once there is
room ends equal to SAELens' SAETrainer run directly (test_sae_kind.check_equals_reference). Before: the
safetensors or torch error's traceback, and a half-written sae_weights.safetensors in sae.out."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from test_sae_kind import check_equals_reference, config
from test_sae_train import make_cache

import hookrun
from hookrun.errors import RunError

sae_lens = pytest.importorskip("sae_lens")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return make_cache(tmp_path_factory.mktemp("sae_full_disk_cache"))


def half_then_full(write):
    """`write(obj, path)`, but the disk fills half-way through the file."""
    def full(obj, path, *args, **kwargs):
        write(obj, path, *args, **kwargs)
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")
    return full


def test_a_full_disk_while_the_sae_is_written_is_one_line_and_resume_writes_it(cache, tmp_path, monkeypatch):
    import sae_lens.saes.sae as sae_module

    torch.set_num_threads(1)
    cfg, out = config(cache, tmp_path / "run"), tmp_path / "run" / "sae"
    monkeypatch.setattr(sae_module, "save_file", half_then_full(sae_module.save_file))
    with pytest.raises(RunError) as err:
        hookrun.run(cfg)
    assert str(err.value).startswith(f"sae: writing the SAE to {out} failed (no space left on the device); ")
    assert not (out / "sae_weights.safetensors").exists() and not (out / "cfg.json").exists()  # nothing looks complete
    assert not list((tmp_path / "run").glob(".sae.*"))  # (its temporary folder removed)
    monkeypatch.undo()
    result = hookrun.run({**cfg, "resume": True})
    assert result.status == "complete"
    check_equals_reference(result.path, out, cache)


def test_a_full_disk_while_a_checkpoint_is_written_is_one_line_and_resume_goes_on(cache, tmp_path, monkeypatch):
    from sae_lens import SAETrainer

    torch.set_num_threads(1)
    cfg, folder = config(cache, tmp_path / "run", checkpoints=2), tmp_path / "run" / "checkpoints"
    state = SAETrainer.save_trainer_state
    calls = []

    def second_fails(self, path):  # the first checkpoint whole, the second cut short by the full disk
        calls.append(path)
        return state(self, path) if len(calls) == 1 else half_then_full(lambda _, p: state(self, Path(p).parent))(None, Path(path) / "trainer_state.pt")

    monkeypatch.setattr(SAETrainer, "save_trainer_state", second_fails)
    with pytest.raises(RunError) as err:
        hookrun.run(cfg)
    assert str(err.value).startswith(f"sae: writing the checkpoint {folder / '448'} failed (no space left on the device; ")
    assert sorted(p.name for p in folder.iterdir()) == ["224"]  # the cut-off one removed
    monkeypatch.undo()
    result = hookrun.run({**cfg, "resume": True})
    assert result.status == "complete"
    check_equals_reference(result.path, tmp_path / "run" / "sae", cache)
