"""A run killed before it wrote anything the report or plot can show (a similarity run: its matrix is
written at the end of a complete pass) is one line that says the run is not complete, as a killed run's
status reads (`stopped: no process holds it (killed?)`), and how far it got; exit status 2."""

from __future__ import annotations

import h5py
from conftest import ROOT
from kill_in_flush import killed_inside_a_flush
from warm_python import python as warm


def test_report_and_plot_of_a_killed_similarity_run_say_it_was_killed(tmp_path) -> None:
    c = {"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
         "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 30}, "batch_size": 5},
         "output": {"path": str(tmp_path / "k.h5"), "flush_every": 1}, "similarity": {"at": ["block1", "fc"], "pool": "mean"}}
    assert killed_inside_a_flush(c, 4).returncode == 9
    with h5py.File(tmp_path / "k.h5") as f:  # (what the kill left: rows of some batches, no matrix)
        assert f.attrs["status"] == "running" and "similarity" not in f.get("captures", {})
        done = int(f.attrs["samples_complete"])
    assert 0 < done < 30
    for command in ("hookrun.report", "hookrun.plot"):
        out = warm(["-m", command, str(tmp_path / "k.h5"), "--out", str(tmp_path / "out")],
                   cwd=ROOT, timeout=300)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hookrun: error: "), out.stderr
        assert (f"the run is not complete (stopped: no process holds it (killed?), {done} samples so far)" in lines[0]), lines[0]
