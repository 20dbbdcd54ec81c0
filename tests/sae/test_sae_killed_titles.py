"""A killed SAE training's pictures and report page said how far it got in samples ("stopped: no process holds
it (killed?), 10 samples so far") where the number counts its logged training steps (a row of curves a step;
inspect's status line already said `10 training steps, 10 logged steps`). Now they say `10 logged steps so
far`. Reference: the file's curve rows and their step numbers, read with h5py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from conftest import ENV, HELPERS
from test_sae_train import CAPTURE, make_cache

from hookrun import open_run

pytest.importorskip("sae_lens")
from hookrun.analysis.report import build_report  # noqa: E402
from hookrun.cli import figures  # noqa: E402
from hookrun.cli import plot_command as plot  # noqa: E402
from hookrun.cli.figure_titles import titles  # noqa: E402


def test_a_killed_sae_trainings_titles_count_logged_steps(tmp_path, monkeypatch):
    cache = make_cache(tmp_path)
    cfg = {"model": {"_target_": "torchvision.ops.MLP", "in_channels": 8, "hidden_channels": [16]},
           "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": 4, "shape": [8]}, "batch_size": 4},
           "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "run" / "captures.h5"), "flush_every": 1},
           "sae": {"from": cache, "capture": CAPTURE, "architecture": "topk", "k": 4, "d_sae": 32, "batch_rows": 32,
                   "rows": 640, "checkpoints": 0, "out": str(tmp_path / "sae")}}
    done = subprocess.run([sys.executable, str(HELPERS / "sae_kill_at_step.py"), "9", "config", json.dumps(cfg)],
                          capture_output=True, text=True, env={**os.environ, **ENV, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]
    path = tmp_path / "run" / "captures.h5"
    with h5py.File(path) as f:
        steps = f["samples/index"][:]
    assert len(steps) and steps.tolist() == list(range(len(steps)))  # (one row of curves a training step)
    note = f"stopped: no process holds it (killed?), {len(steps)} logged steps so far"
    kept: dict[str, object] = {}
    real = figures.save
    monkeypatch.setattr(figures, "save", lambda fig, p, source=None, taken=None: kept.setdefault(
        Path(real(fig, p, source, taken)).name, fig) and p)
    with open_run(path) as run:
        title = build_report(run).data["title"]
        plot.plot_run(run, tmp_path / "figs")
    assert note in title and "samples so far" not in title, title
    drawn = [" ".join(t.get_text().split()) for name, fig in kept.items() if name.startswith("sae_") for t in titles(fig)]
    assert drawn and all(note in t for t in drawn if "so far" in t) and any(note in t for t in drawn), drawn
    assert not any("samples so far" in " ".join(x.get_text().split()) for fig in kept.values() for x in titles(fig))
