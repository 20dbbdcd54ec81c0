"""output.overwrite=true replaces the old file once the new run holds a batch: an error found only at
the first batch (a key the items do not have) destroyed a complete file and left an empty 'failed'
one. (The run also says the old file is as it was.) References: the old file's bytes, read before and after with plain Python, and plain h5py."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from toy_runs import toy_cfg

import hookrun
from hookrun.errors import HookrunError


def test_a_run_failing_at_its_first_batch_leaves_the_file_it_was_to_overwrite(tmp_path, caplog):
    caplog.set_level("WARNING", logger="hookrun")
    cfg = toy_cfg(tmp_path)
    path = hookrun.run(cfg).path
    before = path.read_bytes()
    bad = toy_cfg(tmp_path, **{"output.overwrite": True, "data.collate": {"_target_": "builtins.sum", "_partial_": True}})
    with pytest.raises(HookrunError, match=r"data.collate failed on the samples \[0, 1, 2, 3\]"):  # (found at batch 0)
        hookrun.run(bad)
    assert path.read_bytes() == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith((".", "captures.h5."))]  # no leftover
    assert "is as it was: the run that was to overwrite it failed before its first batch" in caplog.text


def test_a_run_that_writes_a_batch_replaces_the_old_file(tmp_path):
    cfg = toy_cfg(tmp_path)
    path = hookrun.run(cfg).path
    again = toy_cfg(tmp_path, **{"output.overwrite": True, "data.batch_size": 3})
    hookrun.run(again)
    with h5py.File(path) as f:
        assert f.attrs["status"] == "complete" and f.attrs["steps_complete"] == 4
        np.testing.assert_array_equal(f["samples/step"][:], np.repeat(np.arange(4), 3))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("captures")) == ["captures.h5"]


def test_a_dry_run_of_a_resume_plans_it_instead_of_asking_for_resume(tmp_path):
    """dry_run=true resume=true on the file to resume said "exists; set output.overwrite=true, resume=true, ..."
    with resume=true set. Reference: the file, byte for byte, after the dry run."""
    path = hookrun.run(toy_cfg(tmp_path)).path
    before = path.read_bytes()
    result = hookrun.run(toy_cfg(tmp_path, dry_run=True, resume=True))
    assert result.status == "dry_run" and result.estimated_bytes > 0 and path.read_bytes() == before


@pytest.mark.parametrize("status", ["interrupted", "complete"])
def test_resume_with_overwrite_is_refused_and_the_file_is_left_as_it_was(tmp_path, status):
    """resume=true output.overwrite=true resumed the file (or, complete, said "nothing to do"), the overwrite
    silently dropped. Reference: the file's bytes before and after."""
    path = hookrun.run(toy_cfg(tmp_path)).path
    with h5py.File(path, "a") as f:
        f.attrs.update(status=status, steps_complete=1)
    before = path.read_bytes()
    with pytest.raises(HookrunError, match=r"^resume=true keeps the old file's batches and output.overwrite=true replaces "
                                           r"the file: give one of them \(resume=true to continue"):
        hookrun.run(toy_cfg(tmp_path, resume=True, **{"output.overwrite": True}))
    assert path.read_bytes() == before


def test_what_a_killed_overwrite_left_beside_the_file_goes_when_the_next_run_holds_the_lock(tmp_path):
    """An output.overwrite=true run killed before its first batch leaves captures.h5.replacing (the old file
    keeps its name); no later run removed it, a resume=true neither. Reference: the folder's listing."""
    path = hookrun.run(toy_cfg(tmp_path)).path
    with h5py.File(path, "a") as f:
        f.attrs.update(status="interrupted", steps_complete=1)
    for suffix in (".replacing", ".resuming"):  # (a resume killed before it held the old batches: the same)
        path.with_name(path.name + suffix).write_bytes(b"a killed run's new file")
    assert hookrun.run(toy_cfg(tmp_path, resume=True)).status == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captures.h5"]
