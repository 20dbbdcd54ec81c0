"""plot and report name no kind and no action: the kinds draw through their readers, the hook
actions (and Grad-CAM's pairs) through analysis/drawings.py, which both commands iterate; a drawing
registered from outside hookrun/ is drawn and reported like the shipped ones.

References: the files' own text (the names), h5py on the run's file and numpy (the picture's values)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT
from torch import nn

import hookrun

NAMES = ("attribution", "patching", "evaluate", "probe", "similarity", "sae", "lens", "gradcam", "top_examples", "latents")
FILES = ("hookrun/cli/plot_command.py", "hookrun/cli/figures.py", "hookrun/cli/sample_figures.py",
         "hookrun/analysis/report/__init__.py")


@pytest.mark.parametrize("path", FILES)
def test_plot_and_report_name_no_kind_and_no_action(path):
    text = (ROOT / path).read_text().lower()
    found = [n for n in NAMES if n in text]
    assert not found, f"{path} names {found}"
    assert "interpolate" not in text  # the maps are resized once (analysis/images.py), not again here


def test_the_old_picture_module_is_gone_and_the_registry_holds_the_drawings():
    from hookrun.analysis.drawings import DRAWINGS
    from hookrun.analysis.kind_readers import reader_for

    assert not (ROOT / "hookrun/cli/gradcam.py").exists()
    assert {"gradcam", "lens", "latents", "top_examples"} <= set(DRAWINGS)
    assert reader_for("attribution").figures is not None  # the kind's pictures through its reader


def mean_picture(run, samples):
    from hookrun.analysis.report.figure_specs import Heatmap

    out = []
    for info in run.captures:
        if info.role == "output" and len(info.shape) == 2:
            z = np.asarray(run.file[info.path][:], dtype=np.float64)[:samples]
            out.append((f"mine_{info.module}", Heatmap(z, f"mine · {info.module}", xlabel="feature", ylabel="sample")))
    return out


def mine_sections(run, budget):
    return [{"id": "mine", "title": "Mine", "items": [], "note": f"{len(run.captures)} captures"}]


def test_a_drawing_registered_from_outside_is_plotted_and_reported(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from hookrun.analysis import drawings
    from hookrun.analysis.report import build_report
    from hookrun.cli import plot_command, sample_figures

    monkeypatch.setattr(drawings, "DRAWINGS", dict(drawings.DRAWINGS))
    drawings.register_drawing(drawings.Drawing("mine", pictures=f"{__name__}:mean_picture", sections=mine_sections))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    data = torch.utils.data.TensorDataset(torch.randn(5, 4), torch.zeros(5, dtype=torch.long))
    hooks = {"r": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    path = hookrun.run({"hooks": hooks, "device": "cpu", "progress": False, "data": {"batch_size": 5},
                        "output": {"path": str(tmp_path / "m.h5")}}, model=model, dataset=data).path
    drawn = {}
    real = sample_figures.render
    monkeypatch.setattr(plot_command, "render", lambda spec: drawn.setdefault(spec.title.split(" · ")[0], spec) and real(spec))
    with hookrun.open_run(path) as run:
        written = plot_command.plot_run(run, tmp_path / "fig", samples=3)
        report = build_report(run)
    assert "mine_0.png" in [p.name for p in written]
    with h5py.File(path) as f:
        want = f["captures/r/0/output"][:3].astype(np.float64)
    np.testing.assert_allclose(drawn["mine"].z, want)
    assert "mine" in report.sections and report.sections.index("mine") > report.sections.index("captures")


def test_the_drawings_name_the_roles_they_show_themselves():
    from hookrun.analysis.drawings import drawn_roles

    assert {"lens.", "top."} <= set(drawn_roles())
