"""`python -m hookrun.plot` onto a disk that fills (the process's file-size limit, RLIMIT_FSIZE: EFBIG, as a
full disk gives ENOSPC; tests/helpers/file_limit.py): one line, a non-zero exit, and every PNG left under
its own name whole (PIL reads each to its end); no cut-off picture and no hidden temporary file. Before:
PIL's OSError traceback."""

from __future__ import annotations

import h5py
import pytest
from file_limit import limited_run
from PIL import Image

import hookrun


@pytest.mark.slow
def test_plot_onto_a_full_disk_is_one_line_and_leaves_no_cut_off_picture(tmp_path):
    run = hookrun.run({"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
                       "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 8}, "batch_size": 8},
                       "hooks": {"fmap": {"at": ["block1", "block2"], "type": "forward", "actions": [{"name": "record"}]}},
                       "output": {"path": str(tmp_path / "run.h5")}})
    with h5py.File(run.path, "r") as f:
        assert f.attrs["status"] == "complete"
    out = tmp_path / "figs"
    proc = limited_run(["-m", "hookrun.plot", str(run.path), "--out", str(out)], cwd=tmp_path, limit=30_000)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (f"hookrun: error: --out {out}: writing a picture failed (File too "
                                                    "large); the pictures written before it are whole"), proc.stderr[-3000:]
    for png in out.glob("*") if out.exists() else []:
        assert not png.name.startswith("."), png  # (no temporary file left)
        with Image.open(png) as im:
            im.load()  # a cut-off PNG raises here
