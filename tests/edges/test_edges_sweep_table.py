"""A sweep of an edges run's faithfulness settings reads as one table of its results. Reference: each
job's root attribute `patching` read with h5py."""

from __future__ import annotations

import json

import h5py
import numpy as np
from conftest import run_cli

from hookrun.analysis.sweep import open_sweep


def test_a_faithfulness_sweeps_table_has_each_jobs_curve_and_mib_areas(tmp_path):
    """`patching.faithfulness.ablation=corrupt,mean`: the table's only numbers were the edge scores'
    mean and std, equal in both jobs (the ablation changes the faithfulness, not the scores), so the
    two jobs read as the same result."""
    done = run_cli("-m", "experiment=faithfulness", "patching.faithfulness.ablation=corrupt,mean", "patching.ig_steps=2",
                   "data.dataset.n=2", "data.dataset.length=8", "progress=false", "hydra.sweep.dir=sw", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    table = open_sweep(tmp_path / "sw").table()
    assert [r["patching.faithfulness.ablation"] for r in table] == ["corrupt", "mean"]
    for row in table:
        with h5py.File(tmp_path / "sw" / str(row["job"]) / "captures.h5", "r") as f:
            curve = json.loads(f.attrs["patching"])["faithfulness"]
        assert curve["ablation"] == row["patching.faithfulness.ablation"]
        np.testing.assert_array_equal([row[f"recovered@{k}"] for k in curve["k"]], curve["recovered"])
        assert (row["CPR"], row["CMD"]) == (curve["mib"]["cpr"]["area"], curve["mib"]["cmd"]["area"])
    assert table[0]["CPR"] != table[1]["CPR"]
