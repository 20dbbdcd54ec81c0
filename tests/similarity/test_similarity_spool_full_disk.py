"""A similarity run's rows spooled past `similarity.memory` onto a disk that refuses them (the process's
file-size limit, RLIMIT_FSIZE: EFBIG, as a full disk gives ENOSPC; tests/helpers/file_limit.py): one line,
exit 1, the file `failed`, no spool left; `resume=true` once there is room gives numpy's linear CKA on raw
forward hooks' copies of the same outputs. Before: OSError's traceback after the batches' forwards."""

from __future__ import annotations

import h5py
import pytest
from file_limit import limited_run
from test_similarity_spool import numpy_cka

ARGS = ["-m", "hookrun", "model=tiny_cnn", "data=shapes", "data.dataset.size=24", "data.batch_size=8", "device=cpu",
        "progress=false", "output.flush_every=1", "+similarity={at: [block1, block2], estimator: exact, memory: 5MB}",
        "hydra.run.dir=run"]


@pytest.mark.slow
def test_a_spool_the_disk_refuses_is_one_line_and_resume_gives_numpys_cka(tmp_path):
    failed = limited_run(ARGS, cwd=tmp_path, limit=500_000)  # block1's spooled rows: 1.5 MB; the run's file fits
    assert failed.returncode == 1, failed.stderr[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("hookrun: error: similarity: writing the rows beyond similarity.memory to "), failed.stderr[-3000:]
    assert "File too large; free some space there, or raise similarity.memory" in last and "Traceback" not in failed.stderr
    assert not list((tmp_path / "run").glob(".similarity_rows*"))
    with h5py.File(tmp_path / "run" / "captures.h5", "r") as f:
        assert f.attrs["status"] == "failed"
    resumed = limited_run([*ARGS, "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with h5py.File(tmp_path / "run" / "captures.h5", "r") as f:
        assert f.attrs["status"] == "complete"
        assert f["captures/similarity/__model__/linear_cka"][0, 1] == pytest.approx(numpy_cka(["block1", "block2"]), rel=1e-6)
