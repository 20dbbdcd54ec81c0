"""A disk that fills between two flushes (a write past the process's file-size limit: EFBIG, as a full disk
gives ENOSPC; tests/helpers/file_limit.py). HDF5's writes between flushes and the flush itself fail: the run
ends with one line and exit 1, the file under its name is the last whole flush (plain h5py reads it, its
rows equal its counts), and `resume=true` once there is room gives the rows of a run that never failed.
Before: the failed flush's held writes were applied anyway, so its metadata pointed at space never written
('damaged: addr overflow'); or the error came up inside HDF5's flush, the run said 'complete' and the
process died in a segmentation fault as h5py's objects were freed."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from file_limit import limited_run

ARGS = ["-m", "hookrun", "experiment=resnet_layer1", "data.limit=6", "data.batch_size=1", "progress=false",
        "output.flush_every=100"]  # (flushed with its first batch, then at the close: the batches between fail)
LIMIT = 4_000_000  # one batch's rows are 1.6 MB: the first flush fits, the third batch does not


@pytest.mark.slow
def test_a_flush_the_disk_refuses_fails_in_one_line_leaves_the_last_flush_and_resumes(tmp_path):
    failed = limited_run([*ARGS, "hydra.run.dir=run"], cwd=tmp_path, limit=LIMIT)
    assert failed.returncode == 1, failed.stderr[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hookrun: error: writing {tmp_path / 'run' / 'captures.h5'} failed"), failed.stderr[-3000:]
    assert "File too large" in last and "Traceback" not in failed.stderr
    with h5py.File(tmp_path / "run" / "captures.h5", "r") as f:  # the last whole flush, read by plain h5py
        assert f.attrs["status"] == "running"
        steps = int(f.attrs["steps_complete"])
        assert 1 <= steps < 6 and f["samples/index"].shape[0] == steps
        for name in ("layer1.0", "layer1.1"):
            assert f[f"captures/blocks/{name}/output"].shape[0] == steps
    resumed = limited_run([*ARGS, "hydra.run.dir=run", "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    never = limited_run([*ARGS, "hydra.run.dir=never"], cwd=tmp_path)  # the run that never failed
    assert never.returncode == 0, never.stderr[-3000:]
    with h5py.File(tmp_path / "run" / "captures.h5", "r") as got, h5py.File(tmp_path / "never" / "captures.h5", "r") as want:
        assert got.attrs["status"] == "complete"
        for name in ("captures/blocks/layer1.0/output", "captures/blocks/layer1.1/output", "samples/index"):
            np.testing.assert_array_equal(got[name][()], want[name][()])


@pytest.mark.slow
def test_a_write_refused_between_flushes_names_the_batches_the_file_keeps(tmp_path):
    """Flushed every 2 batches: the refused write is found at the next flush, inside a batch's write; the line
    named every batch written (4) where the file keeps those of its last whole flush (2)."""
    args = [a if not a.startswith("output.flush_every=") else "output.flush_every=2" for a in ARGS]
    failed = limited_run([*args, "hydra.run.dir=run"], cwd=tmp_path, limit=LIMIT)
    assert failed.returncode == 1, failed.stderr[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    with h5py.File(tmp_path / "run" / "captures.h5", "r") as f:  # plain h5py: what the file keeps
        steps = int(f.attrs["steps_complete"])
        assert f["samples/index"].shape[0] == steps
    assert last.endswith(f"; the file keeps every batch flushed before it ({steps} batches)"), last
