"""Deletion and insertion curves read true (issue 47 item 6): beside each curve, the same curve with the
pixels in a random order (the reference every reader looks for), equal to a numpy loop over the
definition; `plot` and the report draw the spread over samples (quartiles) and the random order, and
the shipped experiment's baseline makes deletion fall well below the random order.

References: the model called on each masked image in a Python loop (the curves), the figures' own
data (matplotlib's lines and collections, plotly's traces), not pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_attribution_runs import B, N, cfg, numpy_curve

import hookrun

pytest.importorskip("captum")


@pytest.fixture(scope="module")
def model():
    from hookrun.models.tiny_cnn import tiny_cnn

    return tiny_cnn()


@pytest.fixture(scope="module")
def run_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("curves") / "c.h5"
    hookrun.run(cfg(path, method="saliency", measure={"deletion": 4, "insertion": 4}, baseline="zero"))
    return path


def test_random_order_curves_equal_a_loop_over_the_definition(run_path, model):
    from hookrun.data.shapes import shapes

    data = shapes(N)
    x = torch.stack([data[i][0] for i in range(N)]).numpy()
    y = np.array([data[i][1] for i in range(N)])
    p = x.shape[-1] * x.shape[-2]
    # the documented order: each batch draws torch.rand((batch, pixels)) from a generator seeded 0
    scores = np.concatenate([torch.rand((B, p), generator=torch.Generator().manual_seed(0), dtype=torch.float64).numpy()
                             for _ in range(N // B)])
    run = hookrun.open_run(run_path)
    for name in ("deletion", "insertion"):
        want = numpy_curve(model, x, np.zeros_like(x), y, scores, 4, name == "deletion")
        got = run.attribution(f"{name}_random")
        np.testing.assert_allclose(got.values, want, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(run.attribution()[f"{name}_random_area"].values,
                                   np.trapezoid(want, np.linspace(0, 1, 5), axis=1), rtol=1e-5, atol=1e-7)


def test_plot_draws_the_spread_and_the_random_order(run_path):
    pytest.importorskip("matplotlib")
    from hookrun.cli.sample_figures import bands
    from hookrun.runner.kinds.attribution.pictures import curves

    run = hookrun.open_run(run_path)
    fig = bands(curves(run, run.attribution(), ["deletion", "insertion"], "saliency"))
    for ax, name in zip(fig.axes, ("deletion", "insertion"), strict=True):
        labels = [line.get_label() for line in ax.get_lines()]
        random = [line for line in ax.get_lines() if line.get_label().startswith("random order")]
        assert len(random) == 1 and random[0].get_linestyle() == "--", labels
        np.testing.assert_allclose(random[0].get_ydata(), run.attribution(f"{name}_random").values.mean(0))
        band = [c for c in ax.collections if c.get_label() == "middle half of the samples"]
        assert len(band) == 1  # the quartiles' band
        top = band[0].get_paths()[0].vertices[:, 1].max()
        assert top == pytest.approx(np.quantile(run.attribution(name).values, 0.75, axis=0).max())
        assert ax.get_xlabel().startswith("fraction of pixels") and ax.get_ylabel() == "probability of the target"


def test_the_report_draws_the_spread_and_the_random_order(run_path):
    from hookrun.runner.kinds.attribution.report import curves, meta_of

    run = hookrun.open_run(run_path)
    items = curves(run, meta_of(run))
    figs = items[0]["figures"]
    for fig, name in zip(figs, ("deletion", "insertion"), strict=True):
        traces = fig["figure"]["data"]
        random = [t for t in traces if str(t.get("name", "")).startswith("random order")]
        assert len(random) == 1 and random[0]["line"]["dash"] == "dash"
        np.testing.assert_allclose(random[0]["y"], run.attribution(f"{name}_random").values.mean(0))
        assert any(t.get("fill") == "tonexty" for t in traces)
    table = items[1]
    assert "random order" in table["columns"]


@pytest.mark.slow
def test_the_shipped_baseline_makes_deletion_fall_below_the_random_order(tmp_path):
    path = hookrun.run(hookrun.compose("experiment=attribution_shapes", "device=cpu", "progress=false",
                                       "data.dataset.size=16", "attribution.steps=8",
                                       f"output.path={tmp_path / 's.h5'}")).path
    a = hookrun.open_run(path).attribution()
    assert float(a["deletion_area"].mean()) < 0.6 * float(a["deletion_random_area"].mean())
