"""A probe's rows spilled past `probe.memory` onto a disk that refuses them (a full disk; here the
process's file-size limit, RLIMIT_FSIZE, which fails a write past it with EFBIG as a full disk fails it
with ENOSPC): the run stops at that batch with one line, exit 1, the file `failed`; `resume=true` once
there is room fits the probes scikit-learn fits. The spill file was HDF5: its chunks stayed in HDF5's
caches, and the writes the disk refused were lost without an error (h5py ignores an error raised
where a dataset handle is freed), so the run ended `complete` with probes fitted to rows of zeros."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from file_limit import limited_run
from test_probe_ranks import reference

LIMIT = 80 << 10  # bytes a file may reach: the run's file (about 40 KB) fits, block3's spilled rows (131 KB) do not


def test_rows_spilled_onto_a_disk_that_refuses_them_raise_not_read_back_as_zeros(tmp_path):
    """The spill store itself: the rows read back are the rows added, or the write fails in one line."""
    script = ("import numpy as np, torch\n"
              "from hookrun.runner.kinds.probe.rows import RowStore\n"
              "from hookrun.errors import RunError\n"
              "x = torch.randn(4000, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))\n"
              f"s = RowStore(16, 1000, {str(tmp_path / 'p000.rows')!r}, 'block1')\n"
              "try:\n"
              "    for i in range(0, 4000, 500):\n"
              "        s.add(x[i:i + 500], np.zeros(500), np.zeros(500), np.zeros(500))\n"
              "    got = torch.cat([b for _, b in s.blocks()])\n"
              "    print('zero rows', int((got == 0).all(1).sum()), 'equal', bool(torch.equal(got, x)))\n"
              "except RunError as exc:\n"
              "    print('RunError', exc)\n")
    proc = limited_run(["-c", script], cwd=tmp_path, limit=LIMIT)  # 4000 x 16 float64: 512 KB, past the limit
    assert proc.stdout.startswith("RunError probe: writing the rows of block1 beyond probe.memory to "), proc.stdout + proc.stderr[-2000:]
    assert "File too large; free some space there, or raise probe.memory" in proc.stdout


@pytest.mark.slow
def test_a_probe_run_whose_spill_the_disk_refuses_fails_in_one_line_and_resumes_to_sklearns_probes(tmp_path):
    args = ["-m", "hookrun", "experiment=probe_shapes", "probe.at=[block1,block3]", "probe.method=ridge",
            "probe.alpha=2.0", "probe.memory=64KB", "device=cpu", "progress=false", "output.flush_every=1",
            "hydra.run.dir=run"]
    failed = limited_run(args, cwd=tmp_path, limit=LIMIT)
    assert failed.returncode == 1, failed.stderr[-3000:]
    lines = failed.stderr.strip().splitlines()
    assert lines[-1].startswith("hookrun: error: probe: writing the rows of block3 beyond probe.memory to "), failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr
    with h5py.File(tmp_path / "run" / "captures.h5", "r") as f:
        assert f.attrs["status"] == "failed" and "probe" not in f
    resumed = limited_run([*args, "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not list((tmp_path / "run").glob(".probe_rows*"))
    from hookrun.runner.kinds.probe.reader import probe_weights

    with h5py.File(tmp_path / "run" / "captures.h5", "r") as f:
        assert f.attrs["status"] == "complete"
        for at in ("block1", "block3"):  # scikit-learn's Ridge on a raw hook's features of the same 512 items
            weight, bias, _ = reference(at, n=512)
            w, b = probe_weights(f, at)
            np.testing.assert_allclose(w, weight, rtol=1e-6, atol=1e-9)
            np.testing.assert_allclose(b, bias, rtol=1e-6, atol=1e-9)
