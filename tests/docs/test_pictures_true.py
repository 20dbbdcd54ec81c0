"""Pictures that read true (issue 47 item 6, issue 50 item 4): each test reads a figure's data (the
matplotlib figure's titles, labels, scales, images' norms and texts; the report's plotly dicts and
specs) and compares it with what the run's file says, read with h5py / numpy: edge grids centred on
0 with named readers and writers, the circuit laid out by layer with a legend, the attribution maps
at a readable size with a colour bar, class names in captions, titles inside the figure, axis labels
without repetition, count axes linear where the counts are small, the lens' rows named as layers,
and a random network's pictures saying so."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import hookrun
from hookrun import open_run

pytest.importorskip("plotly")
pytest.importorskip("matplotlib")
from hookrun.analysis.report import build_report  # noqa: E402
from hookrun.analysis.report.figure_specs import (  # noqa: E402
    DIVERGING,
    POSITIVE,
    Circuit,
    Heatmap,
    histogram_of,
)
from hookrun.analysis.report.lens_figures import lens_specs  # noqa: E402
from hookrun.analysis.report.plotly_figures import CIRCUIT_UNIT, to_plotly  # noqa: E402
from hookrun.analysis.run_notes import random_weights  # noqa: E402
from hookrun.cli import figures, sample_figures  # noqa: E402
from hookrun.cli import plot_command as plot  # noqa: E402
from hookrun.runner.kinds.patching.report import _circuit, grid_specs, no_effect  # noqa: E402

FAST = ("device=cpu", "progress=false")
SHAPES = ("circle", "square", "triangle", "cross")


def _run(folder: Path, *overrides: str) -> Path:
    hookrun.run(hookrun.compose(*overrides, *FAST, f"output.path={folder / 'captures.h5'}"))
    return folder / "captures.h5"


@pytest.fixture(scope="module")
def edges_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("edges"), "experiment=faithfulness", "data.dataset.n=2", "data.dataset.length=8")


@pytest.fixture(scope="module")
def atp_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("atp"), "experiment=patching_grid", "data.dataset.n=2", "data.dataset.length=8",
                "~patching.sites.attn", "~patching.sites.mlp", "patching.method=atp", "patching.verify=2")


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory) -> Path:
    # a run folder named as Hydra names them (a date and a time): the titles carry it
    return _run(tmp_path_factory.mktemp("shapes") / "2026-11-28_19-22-02", "experiment=shapes_gradcam",
                "data.dataset.size=8", "data.batch_size=4")


@pytest.fixture(scope="module")
def lens_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("lens"), "experiment=logit_lens", "data.dataset.limit=4", "data.dataset.max_length=10")


@pytest.fixture(scope="module")
def random_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("random"), "experiment=resnet_layer1", "data.dataset.size=2", "data.batch_size=2",
                "data.dataset.image_size=[3,32,32]")


def drawn(run_path: Path, out: Path, monkeypatch) -> dict[str, object]:
    """Every figure `plot` draws for the run, by file name (the figures kept after they are saved)."""
    kept: dict[str, object] = {}
    real = figures.save

    def spy(fig, path, source=None, taken=None):
        written = real(fig, path, source, taken)
        kept[Path(written).name] = fig
        return written

    monkeypatch.setattr(figures, "save", spy)
    with open_run(run_path) as run:
        plot.plot_run(run, out)
    return kept


def page(run_path: Path) -> dict:
    with open_run(run_path) as run:
        return build_report(run).data


def section(data: dict, sid: str) -> dict:
    return next(s for s in data["sections"] if s["id"] == sid)


# 1: edge grids centred on 0, site grids on the unpatched run's metric

def test_the_edge_grid_is_centred_on_zero_and_site_grids_on_the_unpatched_metric(edges_run, atp_run, monkeypatch, tmp_path):
    with h5py.File(edges_run) as f:
        meta = json.loads(f.attrs["patching"])
    assert meta["metric_corrupt"] < -1  # the corrupted run's metric is far from 0: centring on it shows every edge red
    with open_run(edges_run) as run:
        heat = next(s for _, _, specs in grid_specs(run) for s in specs if isinstance(s, Heatmap))
    assert heat.centre == 0.0
    trace = to_plotly(heat)["data"][0]
    assert trace["zmid"] == 0.0 and trace["zmin"] == -trace["zmax"]
    fig = drawn(edges_run, tmp_path / "e", monkeypatch)["grid_edges_eap_ig_logit_diff.png"]
    (image,) = fig.axes[0].images
    lo, hi = image.get_clim()
    assert lo == -hi and hi == pytest.approx(np.nanmax(np.abs(heat.z)))
    with h5py.File(atp_run) as f:  # atp: the unpatched run's metric plus the estimated change; normalised, 0 (denoising)
        atp = json.loads(f.attrs["patching"])
    with open_run(atp_run) as run:
        site = next(s for _, _, specs in grid_specs(run) for s in specs if isinstance(s, Heatmap))
    assert atp["normalize"] and site.centre == 0.0
    assert no_effect({**atp, "normalize": False}) == atp["metric_corrupt"]
    assert no_effect({**atp, "normalize": False, "direction": "noise"}) == atp["metric_clean"]
    assert no_effect({**atp, "direction": "noise"}) == 1.0  # normalised noising: the clean run is 1


# 2: readers and writers by name, the dimension `writer` everywhere

def test_edge_grid_axes_are_named_writers_and_readers(edges_run, monkeypatch, tmp_path):
    with h5py.File(edges_run) as f:
        graph = json.loads(f.attrs["patching"])["graph"]
    with open_run(edges_run) as run:
        grid = run.grid("edges")
        _, edges = run.edges()
        heat = next(s for _, _, specs in grid_specs(run) for s in specs if isinstance(s, Heatmap))
        from hookrun.runner.kinds.patching.reader import grid_lines

        lines = grid_lines(run.attrs)
    assert grid.dims == edges.dims == ("writer", "reader")
    assert list(grid.reader.values) == graph["readers"] and list(grid.writer.values) == graph["writers"]
    want = f"writer {len(graph['writers'])} x reader {len(graph['readers'])}: {int(np.isfinite(grid.values).sum())} edges;"
    assert any(line.split(None, 1)[1].startswith(want) for line in lines if line.split()), lines  # (the edges: the finite cells)
    assert heat.ylabel == "writer" and heat.xlabel == "reader" and list(heat.x) == graph["readers"]
    ax = drawn(edges_run, tmp_path / "e", monkeypatch)["grid_edges_eap_ig_logit_diff.png"].axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0] == "L0.H0.q" and set(ticks) <= set(graph["readers"]) and len(ticks) <= 40  # thinned
    assert [t.get_text() for t in ax.get_yticklabels()] == graph["writers"] and ax.get_ylabel() == "writer"
    hover = to_plotly(heat)["data"][0]["customdata"]  # the report: every cell's full names on hover
    assert hover[0][0] == f"{graph['writers'][0]} · {graph['readers'][0]}" and len(hover[0]) == len(graph["readers"])
    old = tmp_path / "old.h5"  # a file whose layout does not name its dims (written before it did) reads the same
    shutil.copy(edges_run, old)
    with h5py.File(old, "r+") as f:
        meta = json.loads(f.attrs["patching"])
        del meta["layout"]["edges"]["dims"]
        f.attrs["patching"] = json.dumps(meta)
    with open_run(old) as run:
        assert run.grid("edges").dims == ("writer", "reader") and list(run.grid("edges").reader.values) == graph["readers"]


# 3: the circuit laid out by layer, labels inside, a legend for sign and width

def _graph(layers: int, heads: int) -> tuple[list[str], list[str]]:
    writers = ["embed", *[n for la in range(layers) for n in [*(f"L{la}.H{h}" for h in range(heads)), f"L{la}.MLP"]]]
    readers = [*[n for la in range(layers) for n in [*(f"L{la}.H{h}.{p}" for h in range(heads) for p in "qkv"), f"L{la}.MLP"]], "logits"]
    return writers, readers


def test_the_circuit_at_twelve_layers_has_rows_by_kind_labels_inside_and_a_legend():
    import xarray as xr

    writers, readers = _graph(12, 12)
    scores = np.random.default_rng(0).normal(size=(len(writers), len(readers)))

    class Run:
        attrs = {"patching": json.dumps({"graph": {"writers": writers, "readers": readers}})}

    grid = xr.DataArray(scores, dims=("writer", "reader"), attrs={"method": "eap", "metric": "logit_diff"})
    c = _circuit(Run(), grid)
    assert isinstance(c, Circuit) and set(c.nodes) == set(writers) | set(readers)
    where = list(zip(c.x, c.y, strict=True))
    assert len(set(where)) == len(where)  # no two nodes on one spot (a head's q, k and v readers included)
    rows = {kind: {y for n, y in zip(c.nodes, c.y, strict=True) if test(n)} for kind, test in (
        ("qkv", lambda n: n.count(".") == 2), ("head", lambda n: ".H" in n and n.count(".") == 1), ("mlp", lambda n: n.endswith("MLP")))}
    assert not (rows["qkv"] & rows["head"] or rows["qkv"] & rows["mlp"] or rows["head"] & rows["mlp"])
    layer_of = lambda n: int(n.split(".")[0][1:])  # noqa: E731
    for a, b in zip(c.nodes, c.y, strict=True):  # by layer: every node of a later layer above every node of an earlier one
        for n, y in zip(c.nodes, c.y, strict=True):
            if a[0] == n[0] == "L" and layer_of(a) < layer_of(n):
                assert b < y
    fig = to_plotly(c)
    layout, nodes = fig["layout"], next(t for t in fig["data"] if t.get("mode") == "markers+text")
    assert nodes["hovertext"] == c.nodes and max(len(t) for t in nodes["text"]) <= 7  # short labels, full names on hover
    lo, hi = layout["xaxis"]["range"]
    px = (layout["width"] - 80) / (hi - lo)
    assert px >= CIRCUIT_UNIT - 1
    for x, text in zip(c.x, nodes["text"], strict=True):  # a label centred on its node, 8 pt: about 0.6 em a character
        half = len(text) * 0.6 * 8 / 2
        assert (x - lo) * px >= half and (hi - x) * px >= half, text
    legend = [t["name"] for t in fig["data"] if t.get("showlegend")]
    assert any(n.startswith("positive") for n in legend) and any(n.startswith("negative") for n in legend)
    assert any(n.startswith("width") for n in legend)
    colours = {t["name"].split(":")[0]: t["line"]["color"] for t in fig["data"] if t.get("showlegend")}
    assert colours["positive"] == POSITIVE and colours["negative"] == DIVERGING[0]
    edge_lines = [t for t in fig["data"] if t.get("mode") == "lines" and not t.get("showlegend")]
    assert all(len(t["x"]) > 2 for t in edge_lines)  # bowed: two edges within one column do not lie on each other


# 4: the attribution maps at a readable size with their colour bar

def test_attribution_maps_are_large_with_a_colour_bar(tmp_path):
    from PIL import Image

    path = tmp_path / "a.h5"
    hookrun.run({"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
                 "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 4}, "batch_size": 4}, "output": {"path": str(path)},
                 "hooks": {"images": {"at": "", "type": "forward_pre", "actions": [{"name": "record", "what": "input"}]}},
                 "attribution": {"method": "saliency"}})
    images = section(page(path), "attribution")["items"][0]["images"]
    with h5py.File(path) as f:
        attr = f["captures/attribution/__model__/attribution"][:].astype(np.float64).sum(1)
    *maps, bar = images
    assert bar.get("colorbar") and len(maps) == len(attr)
    for m, im in zip(attr, maps, strict=True):
        got = np.asarray(Image.open(io.BytesIO(base64.b64decode(im["src"].split(",", 1)[1]))).convert("RGB"), dtype=np.float64)
        assert min(got.shape[:2]) >= 224  # readable, not a thumbnail
        k = got.shape[0] // m.shape[0]
        r, c = np.unravel_index(np.argmax(np.abs(m)), m.shape)  # the strongest pixel: the scale's end colour, opaque
        want = DIVERGING[-1] if m[r, c] > 0 else DIVERGING[0]
        assert np.abs(got[r * k, c * k] - [int(want[i:i + 2], 16) for i in (1, 3, 5)]).max() <= 2
    assert Image.open(io.BytesIO(base64.b64decode(bar["src"].split(",", 1)[1]))).size[0] >= 300


# 5: class names in captions

def test_gradcam_captions_name_the_classes(shapes_run, monkeypatch, tmp_path):
    with h5py.File(shapes_run) as f:
        index = f["samples/index"][:]
    from hookrun.data.shapes import shapes

    ds = shapes(size=8)
    want = [SHAPES[int(ds[int(i)][1])] for i in index]
    cams = section(page(shapes_run), "gradcam")["items"][0]["images"]
    assert [im["caption"].split("target ")[1] for im in cams] == want[: len(cams)]
    seen = {}
    monkeypatch.setattr(sample_figures, "map_row", lambda spec: seen.setdefault("c", spec.captions) and figures.pyplot().figure())
    monkeypatch.setattr(figures, "save", lambda fig, path, source=None, taken=None: path)
    with open_run(shapes_run) as run:
        plot.plot_run(run, tmp_path)
    assert [c.split("target ")[1] for c in seen["c"]] == want[: len(seen["c"])]
    assert all(c.split("pred ")[1].split(" ·")[0] in SHAPES for c in seen["c"])


# 6, 7: titles inside the figure, axis labels without a repeated word

def test_every_title_fits_and_no_axis_label_repeats_a_word(shapes_run, atp_run, monkeypatch, tmp_path):
    kept = {**drawn(shapes_run, tmp_path / "s", monkeypatch), **drawn(atp_run, tmp_path / "a", monkeypatch)}
    assert "fmap_images__model__input.png" in kept and any(k.endswith("_estimate_vs_exact.png") for k in kept)
    assert "hist_patching__cells__value.png" in kept
    for name, fig in kept.items():
        fig.canvas.draw()
        box = fig.bbox
        for t in figures.titles(fig):
            ext = t.get_window_extent()
            assert box.x0 <= ext.x0 and ext.x1 <= box.x1 and ext.y1 <= box.y1, (name, t.get_text())
        for ax in fig.axes:
            for label in (ax.get_xlabel(), ax.get_ylabel()):
                words = label.split()
                assert all(a != b for a, b in zip(words, words[1:], strict=False)), (name, label)
    assert kept["hist_patching__cells__value.png"].axes[0].get_xlabel() == "value"


# 8: linear count axes where the counts are small

def test_count_axes_are_linear_unless_the_counts_span_two_decades():
    small = np.repeat(np.arange(7.0), np.arange(1, 8))  # counts 1 .. 7
    fig = figures.histogram(small, {"mean": 0.0, "std": 1.0, "zeros": 0.0}, "t", "x")
    assert fig.axes[0].get_yscale() == "linear" and fig.axes[0].get_ylabel() == "count"
    spec = histogram_of(small, "t", "x")
    assert not spec.log and to_plotly(spec)["layout"]["yaxis"].get("type") != "log"
    wide = np.concatenate([np.zeros(5000), [1.0]])  # counts 5000 and 1
    fig = figures.histogram(wide, {"mean": 0.0, "std": 1.0, "zeros": 1.0}, "t", "x")
    assert fig.axes[0].get_yscale() == "log"
    spec = histogram_of(wide, "t", "x")
    assert spec.log and to_plotly(spec)["layout"]["yaxis"]["type"] == "log"


# 9: the lens' rows named as layers, no blank column

def test_lens_rows_are_layers_and_no_column_is_blank(lens_run):
    with open_run(lens_run) as run:
        specs = lens_specs(run, 1)
        width = next(c for c in run.captures if c.role == "lens.target_rank").shape[1]
    assert specs
    for s in specs:
        assert list(s.y) == ["embed", "L0", "L1", "L2", "L3"] and "transformer.drop" in s.ylabel
        assert not (~np.isfinite(s.z)).all(0).any(), s.title  # no column without a value
        assert len(s.x) == s.z.shape[1] and all(len(row) == s.z.shape[1] for row in s.cells)
        if "target" in s.title.split(" · ")[1]:
            assert s.z.shape[1] < width and "without a target left out" in s.title


def test_plot_says_truly_where_the_lens_captures_are_shown(lens_run, tmp_path, monkeypatch, capsys):
    """plot said every lens capture was "drawn as lens or latent pictures": the three it draws are
    named with their files (which it writes) and what they show, in one line."""
    kept = drawn(lens_run, tmp_path / "l", monkeypatch)
    out = capsys.readouterr().out
    assert [n for n in kept if n.startswith("lens_")]
    assert out.count("not drawn") == 1 and "lens or latent" not in out
    assert "the logit lens pictures (lens_*.png; the report's Logit lens) show KL, the target's rank and log-probability" in out


def test_lens_rows_go_by_depth_with_ten_layers_or_more(lens_run, tmp_path):
    """HDF5 lists groups in text order: with blocks 10 and up the lens' rows went embed, L0, L1, L10,
    L11, L2 ... The file's blocks renamed to h.2, h.10, h.11, h.12: each row is its module's mean over
    the real tokens (h5py, numpy), the rows by depth."""
    path = tmp_path / "captures.h5"
    shutil.copy(lens_run, path)
    depth = {"0": "2", "1": "10", "2": "11", "3": "12"}
    with h5py.File(path, "r+") as f:
        lens = f["captures/lens"]
        for old, new in depth.items():
            lens.move(f"transformer.h.{old}", f"tmp.{new}")
        for new in depth.values():
            lens.move(f"tmp.{new}", f"transformer.h.{new}")
            for ds in lens[f"transformer.h.{new}"].values():
                ds.attrs["module"] = f"transformer.h.{new}"
        mask = f["samples/attention_mask"][:] > 0
        want = []
        for module in ["transformer.drop", *(f"transformer.h.{n}" for n in ("2", "10", "11", "12"))]:
            v = f[f"captures/lens/{module}/lens.kl_to_final"][:]
            ok = mask & np.isfinite(v)
            want.append(np.where(ok, v, 0).sum(0) / ok.sum(0))
    with open_run(path) as run:
        spec = next(s for s in lens_specs(run, 1) if "KL" in s.title and "mean" in s.title)
    assert list(spec.y) == ["embed", "L2", "L10", "L11", "L12"]
    np.testing.assert_allclose(spec.z, np.array(want)[:, : spec.z.shape[1]], rtol=1e-6)


# 10: a random network's pictures say so

def test_random_weights_are_named_in_the_titles(random_run, lens_run, monkeypatch, tmp_path):
    kept = drawn(random_run, tmp_path / "r", monkeypatch)
    fmaps = [f for n, f in kept.items() if n.startswith("fmap_")]
    assert fmaps and all("random weights" in f._suptitle.get_text() for f in fmaps)
    assert "random weights" in page(random_run)["title"]
    trained = drawn(lens_run, tmp_path / "l", monkeypatch)  # tiny_lm: its shipped trained weights
    assert not any("random weights" in t.get_text() for f in trained.values() for t in figures.titles(f))
    assert "random weights" not in page(lens_run)["title"]
    assert random_weights({"model": {"_target_": "torchvision.models.resnet18", "weights": None}})
    assert not random_weights({"model": {"_target_": "torchvision.models.resnet18", "weights": "DEFAULT"}})
    assert not random_weights({"model": {"_target_": "torchvision.models.resnet18", "weights": None, "checkpoint": "w.pt"}})
    assert random_weights({"model": {"_target_": "hookrun.models.hf", "path": None}})
    assert random_weights({"model": {"_target_": "hookrun.models.vision.timm_model", "pretrained": False}})
    assert not random_weights({"model": {"_target_": "hookrun.models.vision.torchvision_cached", "weights": "cached"}})


# 6 in the report: every plotly title inside its figure, every figure inside its box, in a real browser

def test_report_titles_and_figures_fit_in_the_browser(edges_run, lens_run, tmp_path):
    from headless_browser import chromium, open_page

    driver = next(chromium())
    try:
        for k, path in enumerate((edges_run, lens_run)):
            with open_run(path) as run:
                html = build_report(run).save(tmp_path / f"r{k}.html")
            open_page(driver, Path(html))
            boxes = driver.execute_script("""
                return Array.from(document.querySelectorAll('.js-plotly-plot')).map(p => {
                  const svg = p.querySelector('svg.main-svg').getBoundingClientRect();
                  const t = p.querySelector('.gtitle');
                  const r = t ? t.getBoundingClientRect() : null;
                  const box = p.closest('.fig').getBoundingClientRect();
                  return {title: t ? t.textContent : '', svg: [svg.left, svg.right, svg.top], box: [box.left, box.right],
                          side: !!p.closest('.figs'),
                          t: r ? [r.left, r.right, r.top] : null};
                });""")
            assert boxes
            for b in boxes:
                if b["t"] is not None:
                    assert b["svg"][0] - 1 <= b["t"][0] and b["t"][1] <= b["svg"][1] + 1 and b["t"][2] >= b["svg"][2] - 1, b
                assert not b["side"] or b["svg"][1] <= b["box"][1] + 1, b  # side by side, a wide figure (the circuit) widens its box
    finally:
        driver.quit()



def test_a_run_not_complete_says_so_in_its_titles(random_run, monkeypatch, tmp_path):
    """A run's pictures drawn before it ended show only the rows written so far: every feature map's
    title and the page's title say its status and how many samples, where a complete run's say
    nothing of it. A live run (another process holds the flock on `<file>.lock`, docs/format.md) is
    `running`; once that process is killed (-9) the file still says running, but nothing holds the
    lock: the titles and the page's status row say it stopped (they said running)."""
    import shutil
    import signal
    import subprocess
    import sys

    import h5py

    path = tmp_path / "live" / "captures.h5"
    path.parent.mkdir()
    shutil.copy(random_run, path)
    with h5py.File(path, "r+") as f:
        f.attrs["status"] = "running"  # (as a live or killed run leaves it; its counts as written)
        done = int(f.attrs["samples_complete"])
    holder = subprocess.Popen([sys.executable, "-c", (  # a writer as docs/format.md describes it: flock, its pid
        "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, f'{os.getpid()}\\n'.encode())\nprint('held', flush=True)\ntime.sleep(600)"), f"{path}.lock"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for status, note in (("running", f"running: {done} samples so far"),
                             ("stopped: no process holds it (killed?)", f"stopped: no process holds it (killed?), {done} samples so far")):
            kept = drawn(path, tmp_path / f"figs{len(note)}", monkeypatch)
            fmaps = [f for n, f in kept.items() if n.startswith("fmap_")]
            assert fmaps and all(note in f._suptitle.get_text() for f in fmaps)
            data = page(path)
            assert note in data["title"]
            assert f"['status', '{status}']" in str(section(data, "header")), section(data, "header")
            holder.send_signal(signal.SIGKILL)
            holder.wait()
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / "live" / "captures.h5.lock").exists()  # (the lock file stays; only its lock went)
    complete = drawn(random_run, tmp_path / "c", monkeypatch)
    assert not any("so far" in t.get_text() for f in complete.values() for t in figures.titles(f))
    assert "so far" not in page(random_run)["title"]


def test_plot_draws_an_edges_runs_circuit_as_the_report_does(edges_run, tmp_path, monkeypatch):
    """plot drew no circuit (the report's alone): its lines are the top 30 cells of the file's edge
    scores by |score| (h5py), red positive and blue negative, each 0.5 + 6 |score| / max wide."""
    from matplotlib.colors import to_hex

    kept = drawn(edges_run, tmp_path / "figs", monkeypatch)
    (name,) = [n for n in kept if n.startswith("circuit_")]
    ax = kept[name].axes[0]
    lines = [line for line in ax.lines if len(line.get_xdata())]
    with h5py.File(edges_run, "r") as f:
        values = f["captures/patching/cells/value"][:]
    values = values[np.isfinite(values)]
    want = values[np.argsort(-np.abs(values), kind="stable")[:30]]
    top = float(np.abs(want).max())
    drawn_widths = sorted(line.get_linewidth() for line in lines)
    np.testing.assert_allclose(drawn_widths, sorted(0.5 + 6 * np.abs(want) / top), rtol=1e-9)
    colours = sorted(to_hex(line.get_color()) for line in lines)
    assert colours == sorted(to_hex(POSITIVE if v > 0 else DIVERGING[0]) for v in want)
    assert ax.get_title().startswith("circuit · ")
