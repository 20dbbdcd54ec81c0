"""The SAE sweep's charts (L0 against explained variance, and against ce_loss_score) as drawn: plot's
PNG figure (matplotlib) and the report's plotly JSON hold each job's point at its table values,
labelled with its swept values, axes that fit the points and name the figures, and no y = x line or
"cells" legend (those belong to the patching scatter, an estimate against exact values, which keeps them)."""

from __future__ import annotations

import numpy as np
import pytest

from hookrun.analysis.report.figure_specs import Scatter
from hookrun.analysis.report.plotly_figures import to_plotly
from hookrun.cli.figures import save
from hookrun.cli.sample_figures import render
from hookrun.runner.kinds.sae.reader import sweep_figures

ROWS = [  # a sweep table's rows (sae.k x sae.d_sae) as open_sweep gives them: the last step's figures
    {"job": "0", "sae.d_sae": 64, "sae.k": 4, "status": "complete", "l0": 4.0, "explained_variance": 0.4125,
     "ce_loss_score": 0.71},
    {"job": "1", "sae.d_sae": 128, "sae.k": 4, "status": "complete", "l0": 4.0, "explained_variance": 0.4554,
     "ce_loss_score": 0.74},
    {"job": "2", "sae.d_sae": 64, "sae.k": 8, "status": "complete", "l0": 8.0, "explained_variance": 0.5156,
     "ce_loss_score": 0.80},
    {"job": "3", "sae.d_sae": 128, "sae.k": 8, "status": "complete", "l0": 8.0, "explained_variance": 0.6085,
     "ce_loss_score": 0.86},
]
LABELS = ["sae.d_sae=64, sae.k=4", "sae.d_sae=128, sae.k=4", "sae.d_sae=64, sae.k=8", "sae.d_sae=128, sae.k=8"]


class Table:
    rows = ROWS
    columns = list(ROWS[0])


class Sweep:
    swept = ("sae.d_sae", "sae.k")

    def table(self, captures=None):  # noqa: ANN001, ANN201
        return Table()


@pytest.fixture(scope="module")
def charts() -> dict:
    return dict(sweep_figures(Sweep()))


@pytest.mark.parametrize(("stem", "ykey", "yname"), [("sae_sweep_l0_vs_explained_variance", "explained_variance",
                                                      "explained variance"),
                                                     ("sae_sweep_l0_vs_ce_loss_score", "ce_loss_score", "ce_loss_score")])
def test_png_has_labelled_points_no_diagonal_and_fitting_axes(charts, tmp_path, stem, ykey, yname):
    fig = render(charts[stem])
    ax = fig.axes[0]
    xs, ys = np.array([r["l0"] for r in ROWS]), np.array([r[ykey] for r in ROWS])
    assert not ax.lines and ax.get_legend() is None  # (no y = x, no "cells")
    (points,) = ax.collections
    np.testing.assert_array_equal(points.get_offsets(), np.column_stack([xs, ys]))
    texts = {t.get_text(): t.xy for t in ax.texts}
    assert set(texts) == set(LABELS)
    for label, x, y in zip(LABELS, xs, ys, strict=True):
        assert texts[label] == (x, y)  # each label points at its own job's point
    lo, hi = ax.get_ylim()
    assert lo <= ys.min() and ys.max() <= hi and hi - lo < 2 * np.ptp(ys)  # the points fill the axes (was 0.4 to 8)
    lo, hi = ax.get_xlim()
    assert lo <= xs.min() and xs.max() <= hi and hi - lo < 2 * np.ptp(xs)
    assert "L0" in ax.get_xlabel() and yname in ax.get_ylabel()
    save(fig, tmp_path / f"{stem}.png")
    assert (tmp_path / f"{stem}.png").stat().st_size > 0


@pytest.mark.parametrize(("stem", "ykey"), [("sae_sweep_l0_vs_explained_variance", "explained_variance"),
                                            ("sae_sweep_l0_vs_ce_loss_score", "ce_loss_score")])
def test_report_plotly_has_one_labelled_trace_and_no_diagonal(charts, stem, ykey):
    fig = to_plotly(charts[stem])
    assert [t.get("name") for t in fig["data"]] == ["points"] and fig["layout"]["showlegend"] is False
    (trace,) = fig["data"]
    assert trace["x"] == [r["l0"] for r in ROWS] and trace["y"] == pytest.approx([r[ykey] for r in ROWS], rel=1e-6)
    assert trace["text"] == LABELS and trace["mode"] == "markers+text"
    ys = [r[ykey] for r in ROWS]
    lo, hi = fig["layout"]["yaxis"]["range"]
    assert lo <= min(ys) and max(ys) <= hi and hi - lo < 2 * (max(ys) - min(ys))
    assert "L0" in fig["layout"]["xaxis"]["title"]["text"] and ykey.replace("_", " ")[:10] in \
        fig["layout"]["yaxis"]["title"]["text"].replace("_", " ")


def test_the_patching_scatter_keeps_its_diagonal_and_legend():
    spec = Scatter(np.array([0.1, 0.5]), np.array([0.2, 0.4]), "estimate", "exact", "atp", ["a", "b"],
                   diagonal=True, points="cells")
    ax = render(spec).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["y = x", "cells"] and not ax.texts
    assert ax.lines[0].get_xydata().tolist() == [[0.1, 0.1], [0.5, 0.5]]
    fig = to_plotly(spec)
    assert [t["name"] for t in fig["data"]] == ["cells", "y = x"] and fig["data"][1]["x"] == [0.1, 0.5]
    assert "showlegend" not in fig["layout"] and "range" not in fig["layout"]["xaxis"]


def test_a_job_whose_last_step_is_not_finite_is_said_not_drawn():
    """A job that diverged (its last logged step NaN: the sae run ends failed there) has no point on either
    chart, and the title says so; it was counted as drawn, its label over a point matplotlib left out."""
    diverged = {"job": "4", "sae.d_sae": 256, "sae.k": 8, "status": "failed", "l0": 128.0,
                "explained_variance": float("nan"), "ce_loss_score": float("nan")}

    class Diverged(Sweep):
        def table(self, captures=None):  # noqa: ANN001, ANN201
            return type("T", (), {"rows": [*ROWS, diverged], "columns": list(ROWS[0])})()

    for stem, chart in sweep_figures(Diverged()):
        assert np.isfinite(chart.y).all() and len(chart.y) == len(ROWS), stem
        assert chart.labels == LABELS
        assert chart.title.endswith("(job 4 failed: no point)")
    from hookrun.runner.kinds.sae.reader import sweep_sections

    (section,) = sweep_sections(Diverged())  # the report's table still lists it, with its NaN
    table = next(item for item in section["items"] if item["type"] == "table")
    assert [r[0] for r in table["rows"]] == ["0", "1", "2", "3", "4"] and table["rows"][-1][4] == "nan"
