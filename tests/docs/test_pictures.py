"""Pictures that say what they show (issue 41 items 11-14): one colour convention in plot and
report, titles and names with the method and metric, no picture without information (and a line
saying what was left out), the logit lens' mean over samples, a run table without internals, and
the docs' pictures made by the commands next to them. References: numpy on the file's arrays read
with h5py, the pixels of the PNG, the figure JSON."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import warm_python
from conftest import ROOT

import hookrun
from hookrun.analysis.report.token_text import byte_label

pytest.importorskip("plotly")
pytest.importorskip("matplotlib")
from hookrun.analysis.report import build_report  # noqa: E402
from hookrun.analysis.report.figure_specs import POSITIVE, Heatmap  # noqa: E402
from hookrun.analysis.report.lens_figures import lens_specs  # noqa: E402
from hookrun.analysis.report.plotly_figures import to_plotly  # noqa: E402
from hookrun.cli import figures  # noqa: E402
from hookrun.cli import plot_command as plot  # noqa: E402

FAST = ("device=cpu", "progress=false")
SMALL_PATCH = ("data.dataset.n=2", "data.dataset.length=8", "~patching.sites.attn", "~patching.sites.mlp")


def _run(folder: Path, *overrides: str) -> Path:
    hookrun.run(hookrun.compose(*overrides, *FAST, f"output.path={folder / 'captures.h5'}"))
    return folder / "captures.h5"


@pytest.fixture(scope="module")
def lens_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("lens"), "experiment=logit_lens", "data.dataset.limit=6", "data.dataset.max_length=12")


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("exact"), "experiment=patching_grid", *SMALL_PATCH)


@pytest.fixture(scope="module")
def atp_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("atp"), "experiment=patching_grid", *SMALL_PATCH, "patching.method=atp", "patching.verify=2")


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("shapes"), "experiment=shapes_gradcam", "data.dataset.size=8", "data.batch_size=4")


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])


# item 11: one colour convention, method and metric named

def test_the_largest_positive_cell_is_the_positive_colour_in_plot_and_report(tmp_path):
    from PIL import Image

    spec = Heatmap(np.array([[-1.0, 0.5, 2.0]]), "t", x=["a", "b", "c"], y=["m"], label="logit_diff", centre=0.0)
    fig = figures.heatmap(spec)
    ax = fig.axes[0]
    fig.canvas.draw()
    x, y = ax.transData.transform((2, 0))  # the max cell's centre, in pixels from the bottom left
    height = fig.canvas.get_width_height()[1]
    path = figures.save(fig, tmp_path / "h.png")
    pixel = np.asarray(Image.open(path).convert("RGB"))[int(round(height - y)), int(round(x))]
    assert np.abs(pixel.astype(int) - _rgb(POSITIVE)).max() <= 3, (pixel, POSITIVE)
    trace = to_plotly(spec)["data"][0]
    scale = trace["colorscale"]
    top = scale[-1][1] if not trace.get("reversescale") else scale[0][1]
    assert top == POSITIVE and trace["zmax"] == 2.0 and trace["zmid"] == 0.0


def test_grid_pictures_name_the_method_and_the_normalised_metric(exact_run, atp_run, tmp_path):
    names = {}
    for which, path in (("exact", exact_run), ("atp", atp_run)):
        with hookrun.open_run(path) as run:
            written = plot.plot_run(run, tmp_path / which)
            grid = next(s for s in build_report(run).data["sections"] if s["id"] == "grids")
        heat = grid["items"][0]["figures"][0]["figure"]
        assert heat["layout"]["title"]["text"].replace("<br>", " ") == f"resid · {'exact patching' if which == 'exact' else 'attribution patching (atp)'} · logit_diff (normalised)"
        assert heat["data"][0]["colorbar"]["title"]["text"] == "logit_diff (normalised)"
        names[which] = {p.name for p in written if p.name.startswith("grid_")}
    assert "grid_resid_exact_logit_diff_normalised.png" in names["exact"]
    assert "grid_resid_atp_logit_diff_normalised.png" in names["atp"]


# item 12: no picture without information, and a line saying what was left out

def test_no_histogram_of_token_ids_and_a_line_saying_so(lens_run, tmp_path, capsys):
    with hookrun.open_run(lens_run) as run:
        written = plot.plot_run(run, tmp_path / "fig")
    out = capsys.readouterr().out
    assert not [p for p in written if p.name.startswith("hist_")]
    assert re.search(r"not drawn: .*lens\.top_ids.*", out) or re.search(r"not drawn: the histogram of .* and \d+ more: ", out)
    assert len(out.strip().splitlines()) == 1  # one line, not one per capture


def test_integer_captures_get_no_histogram_whatever_their_role():
    from types import SimpleNamespace

    from hookrun.analysis.report.figure_specs import skip_reason

    assert "token ids" in skip_reason(SimpleNamespace(role="input", dtype="int64"))
    assert skip_reason(SimpleNamespace(role="output", dtype="float32")) is None


def test_flat_gradient_maps_are_not_drawn_in_plot_nor_report(shapes_run, tmp_path, capsys):
    with h5py.File(shapes_run) as f:
        grad = f["captures/fmap_grad/block3/grad"][:2]
    assert np.ptp(grad, axis=(2, 3)).max() <= 1e-6 * np.abs(grad).max()  # the premise: constant over space
    with hookrun.open_run(shapes_run) as run:
        written = plot.plot_run(run, tmp_path / "fig")
        page = build_report(run)
    assert not [p for p in written if p.name.startswith("fmap_fmap_grad")]
    assert "not drawn: the maps of fmap_grad/block3/grad: each channel is one value over space" in capsys.readouterr().out
    caps = next(s for s in page.data["sections"] if s["id"] == "captures")
    assert not [i for i in caps["items"] if i["type"] == "images" and "fmap_grad" in i["title"]]
    assert "fmap_grad/block3/grad" in caps["note"] and "one value over space" in caps["note"]


def test_an_exact_run_has_no_empty_picture_nor_nan_statistics(exact_run, tmp_path, caplog):
    with hookrun.open_run(exact_run) as run:
        page = build_report(run)
        summary = run.summary()
    figs = [f["figure"] for s in page.data["sections"] for i in s["items"] if i["type"] == "figures" for f in i["figures"]]
    assert not [f for f in figs if "recomputed" in f["layout"]["title"]["text"]]  # no "(0 cells recomputed)" scatter
    assert all(any(t.get("x") or t.get("z") for t in f["data"]) for f in figs)
    assert "nan" not in summary and "inf" not in summary
    table = next(s for s in page.data["sections"] if s["id"] == "captures")
    assert not [v for row in table["items"][0]["rows"] for v in row if str(v) in ("nan", "inf", "-inf")]
    assert "patching/cells/exact" in summary and "no values: nothing recomputed" in summary
    with caplog.at_level(logging.INFO, logger="hookrun"):
        _run(tmp_path, "experiment=patching_grid", *SMALL_PATCH)
    said = [r.getMessage() for r in caplog.records if "writing" in r.getMessage()]
    assert said and "0 hook point" not in said[0] and "a patching run (cells)" in said[0]


# item 13: the lens' mean over samples, the run table, the log axes

def test_lens_mean_over_samples_log_rank_and_top1_text(lens_run):
    with h5py.File(lens_run) as f:
        mask = f["samples/attention_mask"][:] > 0
        layers = [k for k in f["captures/lens"]]
        kl = np.stack([f[f"captures/lens/{m}/lens.kl_to_final"][:] for m in layers]).astype(np.float64)
        rank = np.stack([f[f"captures/lens/{m}/lens.target_rank"][:] for m in layers]).astype(np.float64)
        top1 = np.stack([f[f"captures/lens/{m}/lens.top_ids"][:, :, 0] for m in layers])
    kl_mean = np.array([[kl[k][mask[:, p], p].mean() if mask[:, p].any() else np.nan for p in range(kl.shape[2])] for k in range(len(layers))])
    ok = mask & (rank >= 0)
    rank_mean = np.array([[rank[k][ok[k, :, p], p].mean() if ok[k, :, p].any() else np.nan for p in range(rank.shape[2])]
                          for k in range(len(layers))])
    with hookrun.open_run(lens_run) as run:
        specs = lens_specs(run, samples=1)
    by_title = {s.title.split(" · ")[1] + (" mean" if "mean over" in s.title else ""): s for s in specs}
    np.testing.assert_allclose(by_title["KL(final ‖ lens), nats mean"].z, kl_mean, rtol=1e-6)
    kept = np.isfinite(rank_mean).any(0)  # a position without a target in any layer (the last) is left out, and said
    assert not kept.all() and "without a target left out" in by_title["target rank, log10(1 + mean rank) mean"].title
    np.testing.assert_allclose(by_title["target rank, log10(1 + mean rank) mean"].z, np.log10(1 + rank_mean[:, kept]), rtol=1e-6)
    # the label says what is drawn (log of the mean rank; one sample's picture: of its own rank), on the colour
    # bar plot draws and in the report's hover
    for key, said in (("target rank, log10(1 + mean rank) mean", "log10(1 + mean rank)"), ("target rank, log10(1 + rank)", "log10(1 + rank)")):
        bar = [ax for ax in figures.heatmap(by_title[key]).axes if ax.get_label() == "<colorbar>"][0]
        assert bar.get_ylabel().startswith(f"target rank, {said}")
        assert f"target rank, {said}: %{{z" in to_plotly(by_title[key])["data"][0]["hovertemplate"]
    assert "mean over 6 samples" in by_title["KL(final ‖ lens), nats mean"].title
    one = by_title["KL(final ‖ lens), nats"]
    assert [row[: len(one.cells[0])] for row in one.cells] == [[byte_label(int(t)) for t in top1[k, 0, : len(one.cells[0])]]
                                                            for k in range(len(layers))]


def test_run_table_shows_what_was_set_and_done_not_internals(exact_run):
    with hookrun.open_run(exact_run) as run:
        header = build_report(run).data["sections"][0]
    rows = dict(header["items"][0]["rows"])
    assert "previous_flush" not in rows and "format_version" not in rows
    assert not [v for v in rows.values() if str(v).lstrip().startswith(("{", "["))]
    assert rows["done"] == "2 cells in 1 chunks of cells" or rows["done"].endswith("chunks of cells")
    assert rows["patching"].startswith("exact denoise patching, metric logit_diff")


def test_log_histogram_axes_mark_decades_only():
    from hookrun.analysis.report.figure_specs import histogram_of

    spec = histogram_of(np.random.default_rng(0).lognormal(0, 2, 5000), "t", "value")
    layout = to_plotly(spec)["layout"]["yaxis"]
    assert layout["type"] == "log" and layout["dtick"] == 1


# item 14: the docs' pictures come from the commands next to them

@pytest.mark.slow
class _WarmSubprocess:
    """make_pictures' `subprocess`, its `python -m` commands forked from tests/helpers/warm_python.py's
    server (their libraries' imports shared; hookrun imported fresh), every other command as before."""

    def __getattr__(self, name):
        return getattr(subprocess, name)

    @staticmethod
    def run(argv, *, cwd, env, timeout, **kw):
        if argv[0] == sys.executable and argv[1] == "-m":
            return warm_python.run_module(argv[2], argv[3:], cwd=cwd, env=env, timeout=timeout)
        return subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, **kw)


def test_docs_pictures_are_made_by_the_readme_commands(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import make_pictures
    finally:
        sys.path.remove(str(ROOT / "docs"))
    shown = set()
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        shown |= {Path(m).name for m in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())}
    assert shown and shown <= set(make_pictures.PICTURES)  # every picture shown is one the script makes
    commands = make_pictures.see_it_commands()
    assert commands[0].startswith("python -m hookrun experiment=shapes_gradcam")
    # `python docs/make_pictures.py --images ... --work ...`, its main run here and its commands' start-up shared
    monkeypatch.setattr(make_pictures, "subprocess", _WarmSubprocess())
    assert make_pictures.main(["--images", str(tmp_path / "images"), "--work", str(tmp_path / "work")]) == 0
    import matplotlib
    from PIL import Image

    for name in make_pictures.PICTURES:
        with Image.open(tmp_path / "images" / name) as im:
            assert im.width > 600 and im.height > 200
        if name == "report.png":  # a browser's screenshot: its fonts are the machine's
            continue
        with Image.open(tmp_path / "images" / name) as made, Image.open(ROOT / "docs" / "images" / name) as shown:
            assert made.text["Source"].startswith("outputs/")  # no temporary folder in the picture's text
            if shown.text.get("Software") == f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/":
                # within 2 of 255 levels: another CPU's float rounding (AVX-512 or not) moves a line's
                # antialiasing by a level on a few pixels; any change one can see moves far more
                now, then = np.asarray(made).astype(int), np.asarray(shown).astype(int)
                assert now.shape == then.shape and np.abs(now - then).max() <= 2, \
                    f"docs/images/{name} is not what its commands draw now: run python docs/make_pictures.py"
    page = (tmp_path / "work" / "outputs" / "shapes" / "report.html").read_text()
    data = page[page.index('id="hookrun-data">') :]
    assert '"title":"hookrun report: outputs/shapes/captures.h5"' in data  # no temporary path in the page's title
