"""plot's histogram of a capture with NaN or inf beside its finite values (an fp16 overflow, a
masked fill) counts only the finite ones, as it should, but its box said nothing of those left out:
a capture 40% NaN looked whole. Checked against the file's values read with h5py."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun

pytest.importorskip("matplotlib")
from hookrun.cli import figures  # noqa: E402
from hookrun.cli.plot_command import main as plot_main  # noqa: E402


def test_the_histogram_says_how_many_values_it_left_out(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 20, generator=g)
    x[:, :8] = float("nan")  # 40% NaN
    x[0, 8] = float("inf")
    cfg = {"hooks": {"a": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
           "data": {"batch_size": 3, "target": None}, "progress": False, "output": {"path": str(tmp_path / "n.h5")}}
    path = hookrun.run(cfg, model=torch.nn.Sequential(torch.nn.Identity()), dataset=list(x)).path
    with h5py.File(path, "r") as f:
        values = f["captures/a/0/output"][()].astype(np.float64)
    finite = np.isfinite(values)
    seen, save = [], figures.save
    monkeypatch.setattr(figures, "save", lambda fig, p, *a, **k: (seen.append((p.name, fig)), save(fig, p, *a, **k))[1])
    assert plot_main([str(path), "--out", str(tmp_path / "fig")]) == 0
    (fig,) = [fig for name, fig in seen if name.startswith("hist_")]
    ax = fig.axes[0]
    assert sum(p.get_height() for p in ax.patches) == finite.sum()  # (the bars: the finite values only)
    box = " ".join(t.get_text() for t in ax.texts)
    bad = int((~finite).sum())
    assert f"{bad} NaN or inf ({bad / values.size:.1%}) left out" in " ".join(box.split()), box
