"""A sweep of patching runs in open_sweep's table: `patching/cells/exact` holds atp's exactly
recomputed cells (verify: K) and NaN elsewhere, so an exact run's (and an atp run's without verify)
has no value. Its column was `nan` in every row (mean and std of nothing). Now the column holds only
the jobs that recomputed cells; the value column is each job's cells' mean. Reference: numpy over
each job's file."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import yaml

import hookrun

ARGS = ("data.dataset.n=2", "data.dataset.length=6", "~patching.sites.attn", "~patching.sites.mlp", "progress=false")


def test_a_patching_sweeps_table_has_no_column_of_nothing(tmp_path):
    swept = ["patching.method=exact", "patching.method=atp", "patching.method=atp patching.verify=3"]
    for num, overrides in enumerate(swept):
        job = tmp_path / "sweep" / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides.split()))
        hookrun.run(hookrun.compose("experiment=patching_grid", *ARGS, *overrides.split(), f"hydra.run.dir={job}"))
    table = hookrun.open_sweep(tmp_path / "sweep").table()
    rows = {int(r["job"]): r for r in table.rows}
    for num in range(3):
        with h5py.File(tmp_path / "sweep" / str(num) / "captures.h5") as f:
            value, exact = f["captures/patching/cells/value"][:], f["captures/patching/cells/exact"][:]
        assert rows[num]["patching/cells/value:mean"] == pytest.approx(np.nanmean(value), rel=1e-9)
        if num < 2:
            assert np.isnan(exact).all() and rows[num].get("patching/cells/exact:mean") is None
        else:
            assert np.isfinite(exact).sum() == 3
            assert rows[num]["patching/cells/exact:mean"] == pytest.approx(np.nanmean(exact), rel=1e-9)
