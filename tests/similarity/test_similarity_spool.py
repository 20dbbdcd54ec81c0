"""A similarity run's spooled rows (the exact estimator's sample-space route) go to a scratch folder
beside the run's file (hookrun/output/scratch.py), not the system's temporary folder (often memory:
tmpfs), and are removed at the end."""

from __future__ import annotations

import hookrun


def test_a_similarity_runs_spooled_rows_go_beside_its_file(tmp_path, monkeypatch):
    from hookrun.runner.kinds.similarity import accumulate

    made, real = [], accumulate.Scratch
    monkeypatch.setattr(accumulate, "Scratch", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    seen = []
    monkeypatch.setattr("hookrun.runner.kinds.similarity.kind.Scratch",
                        lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    hookrun.run({"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
                 "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 24}, "batch_size": 8},
                 "output": {"path": str(tmp_path / "s.h5")},
                 "similarity": {"at": ["block1", "block2"], "estimator": "exact"}})
    assert not made and [s.path for s in seen] == [tmp_path / ".similarity_rows.s.h5.rank-00000"]
    assert not list(tmp_path.glob(".similarity_rows*"))  # removed at the end
