"""A similarity run's rows on the exact estimator's sample-space route: held in memory where `memory`
leaves room beside the route's n x n matrices, else spooled to a scratch folder beside the run's file
(hookrun/output/scratch.py), not the system's temporary folder (often memory: tmpfs), and removed at
the end; spooled from the batch where the rows held would pass that room, the rows before it first.
Reference: numpy's linear CKA on raw forward hooks' copies of the same outputs."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun


def numpy_cka(names: list[str]) -> float:
    from hookrun.data.shapes import shapes
    from hookrun.models.tiny_cnn import tiny_cnn

    model, data = tiny_cnn(), shapes(24)
    out = {}
    for n in names:
        model.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: out.__setitem__(n, o.detach().clone()))
    with torch.no_grad():
        model(torch.stack([data[i][0] for i in range(24)]))
    a, b = (out[n].double().numpy().reshape(24, -1) for n in names)
    a, b = a - a.mean(0), b - b.mean(0)
    k, l_ = a @ a.T, b @ b.T
    return float(np.vdot(k, l_) / np.sqrt(np.vdot(k, k) * np.vdot(l_, l_)))


# route_bytes is 3.9 MB here (24 items; a 16384-feature slab) and the rows 2.4 MB: 5MB holds a third
@pytest.mark.parametrize(("memory", "spooled"), [("2GB", False), ("5MB", True)])
def test_a_similarity_runs_rows_are_held_or_spooled_beside_its_file(tmp_path, monkeypatch, memory, spooled):
    from hookrun.runner.kinds.similarity import rows

    made, real = [], rows.Scratch
    monkeypatch.setattr(rows, "Scratch", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    seen = []
    monkeypatch.setattr("hookrun.runner.kinds.similarity.kind.Scratch",
                        lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    wrote = []
    monkeypatch.setattr(rows.SeriesRows, "spill", lambda self, f=rows.SeriesRows.spill: wrote.append(self.n) or f(self))
    hookrun.run({"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
                 "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 24}, "batch_size": 8},
                 "output": {"path": str(tmp_path / "s.h5")},
                 "similarity": {"at": ["block1", "block2"], "estimator": "exact", "memory": memory}})
    assert not made  # never the system's temporary folder
    assert [s.path for s in seen] == ([tmp_path / ".similarity_rows.s.h5.rank-00000"] if spooled else [])
    assert wrote[:1] == ([8] if spooled else [])  # (the first batch held, then spooled with the rest)
    assert not list(tmp_path.glob(".similarity_rows*"))  # removed at the end
    with h5py.File(tmp_path / "s.h5") as f:
        got = f["captures/similarity/__model__/linear_cka"][()]
    assert got[0, 1] == pytest.approx(numpy_cka(["block1", "block2"]), rel=1e-6)


def test_a_killed_runs_spool_is_removed_by_the_next_run_that_holds_its_rows_in_memory(tmp_path):
    """(The folder was cleared only where the next run spooled too, and stayed beside the file.)"""
    from kill_in_flush import killed_inside_a_flush

    config = {"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
              "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 24}, "batch_size": 4},
              "output": {"path": str(tmp_path / "k.h5"), "flush_every": 1},
              "similarity": {"at": ["block1", "block2"], "memory": "5MB"}}
    assert killed_inside_a_flush(config, 4).returncode == 9
    assert [p.name for p in tmp_path.glob(".similarity_rows*")] == [".similarity_rows.k.h5.rank-00000"]
    config["output"]["overwrite"], config["similarity"]["memory"] = True, "2GB"
    assert hookrun.run(config).status == "complete"
    assert not list(tmp_path.glob(".similarity_rows*"))
    with h5py.File(tmp_path / "k.h5") as f:
        assert f["captures/similarity/__model__/linear_cka"][0, 1] == pytest.approx(numpy_cka(["block1", "block2"]),
                                                                                     rel=1e-6)
