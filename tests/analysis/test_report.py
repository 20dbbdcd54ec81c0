"""The HTML report without a browser (tests/analysis/test_report_browser.py opens it in one) and plot's sweep
charts: escaping, bad input in one line, names that never replace another run's report, the
notebook view, bounded reading, and each metric against each swept parameter."""

from __future__ import annotations

import json
import os
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from conftest import ROOT, run_cli
from warm_python import python as warm

import hookrun
from hookrun.analysis.report import Report
from hookrun.analysis.report.figure_specs import Heatmap
from hookrun.analysis.report.page import dumps, render
from hookrun.analysis.report.plotly_figures import to_plotly
from hookrun.analysis.report.run_sections import sampled_rows

pytest.importorskip("plotly")
EVIL = "</script><script>alert(1)</script><!-- <img src=x onerror=alert(2)> & \u2028\u2029 </SCRIPT >"


def cli(*args: str) -> subprocess.CompletedProcess:
    return warm(["-m", "hookrun.report", *map(str, args)], cwd=ROOT, timeout=600)


def test_data_cannot_end_its_script_block_nor_become_markup():
    text = dumps({"t": EVIL, "n": float("nan")})
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == {"t": EVIL, "n": None}
    fig = to_plotly(Heatmap(np.eye(2), EVIL, x=[EVIL, "a"], y=["<b>", "c"], xlabel="key", ylabel="query"))
    page = render({"title": EVIL, "source": EVIL, "sections": [{"id": "header", "title": EVIL, "note": EVIL, "items": [
        {"type": "kv", "rows": [[EVIL, EVIL]]}, {"type": "figure", "figure": fig, "caption": EVIL}]}]})

    class Tags(HTMLParser):  # what an HTML parser sees: the page's own elements only
        def __init__(self) -> None:
            super().__init__()
            self.tags, self.data = [], {}

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            self.current = dict(attrs).get("id")

        def handle_data(self, data):
            if data.strip() and self.tags and self.tags[-1] == "script" and getattr(self, "current", None) == "hookrun-data":
                self.data = json.loads(data)

    p = Tags()
    p.feed(page)
    assert p.tags.count("script") == 3 and "img" not in p.tags and "b" not in p.tags
    assert p.data["sections"][0]["items"][0]["rows"] == [[EVIL, EVIL]]
    assert p.data["sections"][0]["items"][1]["figure"]["layout"]["xaxis"]["ticktext"][0].startswith("&lt;/script&gt;")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("run")
    cfg = hookrun.compose("experiment=shapes_gradcam", "data.dataset.size=8", "data.batch_size=4", "device=cpu", "progress=false",
                          f"output.path={folder / 'a.h5'}")
    hookrun.run(cfg)
    return folder / "a.h5"


@pytest.mark.slow
def test_bad_input_is_one_line_and_status_2(tmp_path, small_run):
    (tmp_path / "notes.txt").write_text("hello")
    empty = tmp_path / "empty.h5"
    with h5py.File(empty, "w") as f:  # a hookrun file with nothing in it
        f.attrs["format_version"] = 1
        f.create_dataset("samples/index", data=np.zeros(0, dtype=np.int64))
    (tmp_path / "file").write_text("")
    cases = [(tmp_path / "notes.txt", [], "not a readable HDF5 file"), (tmp_path / "nowhere", [], "no file"),
             (empty, [], "nothing to show"), (small_run, ["--out", tmp_path / "file" / "r.html"], "cannot create the folder")]
    for path, extra, message in cases:
        proc = cli(path, *extra)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_second_runs_report_in_the_same_folder_gets_another_name(small_run, tmp_path):
    other = small_run.with_name("b.h5")
    other.write_bytes(small_run.read_bytes())
    first, second, again = cli(small_run), cli(other), cli(small_run)
    assert first.returncode == second.returncode == again.returncode == 0, (first.stderr, second.stderr)
    name = lambda p: Path(p.stdout.split("wrote ", 1)[1].split(" (")[0])  # noqa: E731
    assert name(first) == name(again) == small_run.parent / "report.html"
    assert name(second).parent == small_run.parent and name(second).name.startswith("report.") and name(second) != name(first)
    assert str(other) in name(second).read_text()[:2000] and str(small_run) in name(first).read_text()[:2000]


def test_notebook_view_is_the_same_page_in_an_iframe(small_run):
    import html

    with hookrun.open_run(small_run) as run:
        page = run.report()
    assert isinstance(page, Report) and page.sections == ["header", "gradcam", "captures"]  # Grad-CAM: issue 39 item 4
    shown = page._repr_html_()
    assert shown.startswith("<iframe srcdoc=") and html.unescape(shown.split('srcdoc="', 1)[1].split('" style=')[0]) == page.html
    maps = [i for i in page.data["sections"][2]["items"] if i["type"] == "images"]
    cams = page.data["sections"][1]["items"]
    assert len(cams) == 1 and len(cams[0]["images"]) == 8 and cams[0]["images"][0]["caption"].startswith("#0 · pred ")
    assert maps and all(im["src"].startswith("data:image/png;base64,") for m in maps for im in m["images"])


def test_gradcam_with_fewer_images_recorded_shows_those_over_them(tmp_path):
    """The input recorded for 4 samples (limit 4): the section said "no input images recorded" and
    drew 8 bare maps; now the first 4, each over its own recorded image (numpy's Grad-CAM and
    min-max picture from h5py's rows), and the title says why 4."""
    from hookrun.analysis.report.gradcam_section import overlay_png

    path = tmp_path / "a.h5"
    hookrun.run(hookrun.compose("experiment=shapes_gradcam", "data.dataset.size=8", "data.batch_size=4", "device=cpu",
                                "progress=false", f"output.path={path}", "hooks.images.actions=[{name: record, what: input, limit: 4}]"))
    with hookrun.open_run(path) as run:
        (cams,) = run.report().data["sections"][1]["items"]
    assert "no input images" not in cams["title"] and "recorded for the first 4" in cams["title"], cams["title"]
    assert len(cams["images"]) == 4
    with h5py.File(path) as f:
        act, grad = f["captures/fmap/block3/output"][:4].astype(np.float64), f["captures/fmap_grad/block3/grad"][:4].astype(np.float64)
        x = f["captures/images/__model__/input"][:4].astype(np.float64)
    cam = np.maximum((grad.mean(axis=(2, 3), keepdims=True) * act).sum(1), 0)
    cam /= cam.reshape(4, -1).max(1)[:, None, None]
    for k, im in enumerate(cams["images"]):
        got, alone = decode_png(im["src"]), decode_png(overlay_png(cam[k], None, ))
        picture = (x[k] - x[k].min()) / (x[k].max() - x[k].min())
        step = got.shape[0] // picture.shape[1]
        base = np.repeat(np.repeat(np.moveaxis(picture, 0, -1), step, 0), step, 1)
        base = np.repeat(base, 3, -1) if base.shape[-1] == 1 else base
        np.testing.assert_allclose(got / 255, 0.5 * base + 0.5 * alone / 255, atol=2.5 / 255)


def decode_png(src: str) -> np.ndarray:
    import base64
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("RGB"), dtype=np.float64)


def test_captures_with_no_rows_neither_crash_the_report_nor_make_an_empty_page(small_run, tmp_path):
    """0-row captures (a run stopped before its first batch) crashed the Grad-CAM section ('cannot
    reshape array of size 0'); some rows written: the page, the empty ones noted; none: one line, status 2."""
    from hookrun.analysis.report import build_report
    from hookrun.errors import NotFoundError

    def emptied(keep):
        path = tmp_path / f"{keep or 'none'}.h5"
        path.write_bytes(small_run.read_bytes())
        with h5py.File(path, "r+") as f:
            f["captures"].visititems(lambda n, o: o.resize(0, axis=0) if isinstance(o, h5py.Dataset) and o.maxshape[0] is None
                                     and not (keep and n.startswith(keep)) else None)
        return path

    with hookrun.open_run(emptied("logits")) as run:
        data = build_report(run).data
    assert [s["id"] for s in data["sections"]] == ["header", "captures"]
    assert "fmap/block3/output" in data["sections"][1]["note"]
    with hookrun.open_run(emptied(None)) as run, pytest.raises(NotFoundError, match="nothing to show"):
        build_report(run)


def test_notebook_save_replaces_only_this_runs_page(small_run, tmp_path):
    """Report.save was a plain write_text: a user's own file, or another run's report, was lost."""
    from hookrun.errors import ConfigError

    with hookrun.open_run(small_run) as run:
        page = run.report()
    mine, theirs = tmp_path / "notes.html", tmp_path / "other.html"
    mine.write_text("keep me")
    theirs.write_text(page.html.replace(str(small_run), str(tmp_path / "another.h5")))
    for path, held in ((mine, "a file that is not a hookrun report"), (theirs, f"the report of {tmp_path / 'another.h5'}")):
        before = path.read_text()
        with pytest.raises(ConfigError, match=f"holds {held}; name another path, or save\\(path, overwrite=True\\)"):
            page.save(path)
        assert path.read_text() == before
    assert page.save(tmp_path / "r.html").read_text() == page.html
    assert page.save(tmp_path / "r.html").read_text() == page.html  # its own page: replaced
    assert page.save(mine, overwrite=True).read_text() == page.html
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.html", "other.html", "r.html"]  # no temporary file left


def test_a_live_data_set_is_named_in_the_header_as_inspect_names_it(tmp_path):
    from toy_models import EveryOtherBatch, SignedRows
    from toy_runs import lin_cfg

    from hookrun.analysis.report.run_sections import header

    path = hookrun.run(lin_cfg(tmp_path), model=EveryOtherBatch(), dataset=SignedRows()).path
    with hookrun.open_run(path) as run:
        rows = dict(header(run)["items"][0]["rows"]) if "items" in header(run) else None
    assert rows is not None and rows["data"] == "toy_models.SignedRows, batch 2"


def test_sampled_rows_read_spread_blocks_of_the_file(tmp_path):
    with h5py.File(tmp_path / "x.h5", "w") as f:
        data = np.arange(10_000 * 4, dtype=np.float32).reshape(10_000, 4)
        ds = f.create_dataset("x", data=data, chunks=(100, 4))
        rows, note = sampled_rows(ds, values=400, blocks=4)
        assert rows.shape == (100, 4) and note == "a sample of 100 of 10000 rows, in 4 blocks"
        starts = np.linspace(0, 10_000 - 25, 4).astype(int)
        np.testing.assert_array_equal(rows, np.concatenate([data[s : s + 25] for s in starts]))
        everything, note = sampled_rows(ds, values=10**9)
        assert everything.shape == data.shape and note == ""


def test_a_histogram_holds_at_most_values_values_where_one_row_is_larger(small_run, monkeypatch):
    """--values 500 on rows of 2,048 values made histograms of 2,048 (one whole row). Reference: the
    file's first row, read with h5py, at evenly spaced positions."""
    from hookrun.analysis.report import run_sections

    seen, histogram_of = {}, run_sections.histogram_of
    monkeypatch.setattr(run_sections, "histogram_of", lambda v, title, *a: seen.setdefault(title, (v, a)) and histogram_of(v, title, *a))
    with hookrun.open_run(small_run) as run:
        run_sections.captures(run, run_sections.Budget(values=500))
        row = run.file["captures/fmap/block3/output"][0].astype(np.float64).ravel()
    values, (_, note) = seen["fmap/block3/output"]
    assert row.size > 500 and note == f"500 evenly spaced values of 1 of 8 rows ({row.size} values a row)"
    np.testing.assert_array_equal(values, row[np.linspace(0, row.size - 1, 500).astype(np.int64)])


def fake_sweep(folder: Path, factors: list[float]) -> None:
    """A Hydra sweep's layout (N/.hydra/overrides.yaml, N/captures.h5), each job run in-process."""
    for num, factor in enumerate(factors):
        job = folder / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"params.factor={factor}"]))
        cfg = hookrun.compose("experiment=ablation_sweep", f"params.factor={factor}", "data.limit=1", "data.batch_size=4",
                              "device=cpu", "progress=false", f"output.path={job / 'captures.h5'}")
        hookrun.run(cfg)


@pytest.mark.slow
def test_plot_sweep_draws_each_evaluation_metric_against_the_swept_parameter(tmp_path):
    fake_sweep(tmp_path / "sweep", [0.0, 0.5, 1.0])
    proc = warm(["-m", "hookrun.plot", str(tmp_path / "sweep"), "--out", str(tmp_path / "fig")],
                cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    drawn = {p.name for p in (tmp_path / "fig").glob("*.png")}
    assert {"sweep_ce_intervened_vs_params.factor.png", "sweep_kl_div_score_vs_params.factor.png"} <= drawn
    from PIL import Image

    with Image.open(tmp_path / "fig" / "sweep_ce_intervened_vs_params.factor.png") as im:  # not empty axes: a line is drawn
        pixels = np.asarray(im.convert("RGB"), dtype=np.int32)
    blue = (np.abs(pixels - np.array([31, 119, 180])).sum(axis=-1) < 30).sum()
    assert blue > 200
    from hookrun.analysis import open_sweep
    from hookrun.analysis.report.sweep_charts import sweep_charts

    sweep = open_sweep(tmp_path / "sweep")
    chart = next(c for c in sweep_charts(sweep.table(), sweep.swept, ["ce_intervened"]))
    for num, y in zip(("0", "1", "2"), chart.series["ce_intervened"], strict=True):
        with h5py.File(tmp_path / "sweep" / num / "captures.h5") as f:
            assert y == pytest.approx(float(f["evaluation/model"].attrs["ce_intervened"]))


def test_a_swept_value_over_decades_gets_a_log_axis_in_plot_and_report():
    from hookrun.analysis.kind_readers import Table
    from hookrun.analysis.report.plotly_figures import lines as plotly_lines
    from hookrun.analysis.report.sweep_charts import sweep_charts
    from hookrun.cli.figures import lines as png_lines

    def chart(values):
        table = Table(["job", "probe.C", "test@fc"], [{"job": i, "probe.C": v, "test@fc": 0.5 + 0.1 * i}
                                                     for i, v in enumerate(values)])
        return sweep_charts(table, ["probe.C"], ["test@fc"])[0]

    wide, narrow, seeds = chart([0.01, 1, 100]), chart([0.5, 1.0, 2.0]), chart([1, 10, 100])
    assert wide.log_x and not narrow.log_x and not seeds.log_x  # (whole numbers stay categories)
    assert plotly_lines(wide)["layout"]["xaxis"]["type"] == "log" and "type" not in plotly_lines(narrow)["layout"]["xaxis"]
    assert png_lines(wide).axes[0].get_xscale() == "log" and png_lines(narrow).axes[0].get_xscale() == "linear"


def test_a_swept_module_name_is_drawn_by_depth_not_in_text_order():
    """probe.at=transformer.h.2,transformer.h.10,...: the axis went h.1, h.10, h.11, h.2 (text order)."""
    from hookrun.analysis.kind_readers import Table
    from hookrun.analysis.report.sweep_charts import sweep_charts
    from hookrun.cli.figures import lines as png_lines

    names = ["transformer.h.10", "transformer.h.2", "transformer.h.11", "transformer.h.1"]
    table = Table(["job", "probe.at", "test"], [{"job": i, "probe.at": v, "test": float(v.rsplit(".", 1)[1])}
                                                for i, v in enumerate(names)])
    chart = sweep_charts(table, ["probe.at"], ["test"])[0]
    depth = sorted(names, key=lambda n: int(n.rsplit(".", 1)[1]))
    assert chart.x == depth and chart.series["test"] == [1.0, 2.0, 10.0, 11.0]
    assert [t.get_text() for t in png_lines(chart).axes[0].get_xticklabels()] == depth


def test_hook_points_by_depth_are_drawn_in_their_order_under_their_own_names():
    """A probe's depth figure: the module names as given (h.10 after h.9, Sequential's 0, 1, 2 once each)."""
    from hookrun.analysis.report.figure_specs import Lines
    from hookrun.analysis.report.plotly_figures import lines as plotly_lines
    from hookrun.cli.figures import lines as png_lines

    names = [f"transformer.h.{i}" for i in (0, 1, 2, 9, 10, 11)]
    spec = Lines(x=names, series={"test": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]}, xlabel="hook point", ylabel="acc",
                 title="t", in_order=True)
    fig = png_lines(spec)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == names
    assert list(fig.axes[0].lines[0].get_ydata()) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    drawn = plotly_lines(spec)
    assert drawn["data"][0]["x"] == names and drawn["layout"]["xaxis"]["type"] == "category"
    digits = png_lines(Lines(x=["0", "1", "2"], series={"r2": [1.0, 0.5, 0.3]}, xlabel="", ylabel="", title="",
                             in_order=True))
    assert [t.get_text() for t in digits.axes[0].get_xticklabels()] == ["0", "1", "2"]


@pytest.mark.parametrize(("z", "note"), [([[1 + 2e-16, 0.4], [0.4, 1.0]], None), ([[1.0, -0.03], [-0.03, 1.0]], "below 0"),
                                         ([[1.02, -0.5], [0.5, np.nan]], "below 0 or above 1")])
def test_the_reports_colour_bar_says_where_cells_lie_beyond_its_fixed_range(z, note):
    """plot's bar has an arrow for a value beyond a fixed range (minibatch CKA below 0); plotly's bar
    has none, so its title says which cells take an end's colour."""
    from hookrun.analysis.report.figure_specs import Heatmap

    trace = to_plotly(Heatmap(z=np.array(z), title="t", label="CKA", range=(0.0, 1.0)))["data"][0]
    title = trace["colorbar"]["title"]["text"]
    assert (trace["zmin"], trace["zmax"]) == (0.0, 1.0)
    nan = "<br><sub>1 cell NaN or inf: grey, no value</sub>" if np.isnan(np.array(z)).any() else ""  # (a gap, said so)
    assert title == "CKA" + nan if note is None else title == f"CKA{nan}<br><sub>cells {note}:<br>the end's colour</sub>"


def test_a_heatmaps_long_column_labels_stand_upright_instead_of_overlapping():
    import numpy as np
    from matplotlib.transforms import Bbox

    from hookrun.analysis.report.figure_specs import Heatmap
    from hookrun.cli.figures import heatmap

    def labels(names):
        fig = heatmap(Heatmap(z=np.eye(len(names)), title="t", x=names, y=names, range=(0.0, 1.0)))
        fig.canvas.draw()
        ticks = fig.axes[0].get_xticklabels()
        boxes = [t.get_window_extent() for t in ticks]
        return {t.get_rotation() for t in ticks}, any(Bbox.intersection(a, b) is not None
                                                      for a, b in zip(boxes, boxes[1:], strict=False))

    lm = ["transformer.wte", *(f"transformer.h.{i}" for i in range(4)), "transformer.ln_f"]
    assert labels(lm) == ({90.0}, False)  # (drawn flat, these six overlapped)
    assert labels(["layer1", "layer2", "layer3", "layer4"]) == ({0.0}, False)
    from hookrun.analysis.report.figure_specs import Lines
    from hookrun.cli.figures import lines

    deep = [f"model.layers.{i}.mlp" for i in range(24)]  # a probe by depth over a 24-layer model
    fig = lines(Lines(x=deep, series={"test": [0.5] * 24}, xlabel="", ylabel="", title="", in_order=True))
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in fig.axes[0].get_xticklabels()]
    assert len(boxes) == 24 and all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:], strict=False))


@pytest.mark.slow
def test_plot_sweep_with_nothing_to_draw_writes_nothing_and_fails(tmp_path):
    for num in ("0", "1"):
        (tmp_path / "s" / num / ".hydra").mkdir(parents=True)
        (tmp_path / "s" / num / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"params.factor={num}"]))
    proc = warm(["-m", "hookrun.plot", str(tmp_path / "s")], cwd=ROOT, timeout=600)
    assert proc.returncode == 2 and "nothing to draw" in proc.stderr, proc.stderr
    assert not (tmp_path / "s" / "figures").exists() or not list((tmp_path / "s" / "figures").iterdir())


@pytest.mark.slow
def test_a_run_in_an_object_store_reports_through_open_run(tmp_path, monkeypatch):
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for key, value in (("AWS_ENDPOINT_URL", f"http://{host}:{port}"), ("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s"),
                           ("AWS_DEFAULT_REGION", "us-east-1"), ("HOOKRUN_CACHE_DIR", str(tmp_path / "cache"))):
            monkeypatch.setenv(key, value)
        boto3.client("s3").create_bucket(Bucket="runs")
        url = "s3://runs/shapes/captures.h5"
        run = run_cli("experiment=shapes_gradcam", "data.dataset.size=8", "device=cpu", "progress=false", f"output.path={url}",
                      f"output.staging={tmp_path / 'stage'}", f"hydra.run.dir={tmp_path / 'run'}")
        assert run.returncode == 0, run.stderr
        proc = warm(["-m", "hookrun.report", url], cwd=tmp_path, timeout=600,
                    env={**os.environ, "PYTHONPATH": str(ROOT)})  # (the default: report.html in the current folder)
        assert proc.returncode == 0, proc.stderr
        page = (tmp_path / "report.html").read_text()
        assert f'content="{url}"' in page and "fmap/block3/output" in page
    finally:
        server.stop()


def test_latents_shade_each_context_token_with_its_own_activation_in_left_padded_rows(tmp_path):
    """A top example's position is its index in the padded row, /samples/token_position counts real
    tokens: with left padding the report's per-token values must still be each token's own
    activation, read here from a raw forward hook on the same model and inputs."""
    import torch

    from hookrun.analysis.report.latents import latents
    from hookrun.analysis.report.run_sections import Budget
    from hookrun.data import text
    from hookrun.models import tiny_lm

    data = {"_target_": "hookrun.data.text", "files": "pydoc_topics", "max_length": 24, "limit": 8, "padding_side": "left"}
    cfg = {"model": {"_target_": "hookrun.models.tiny_lm"}, "data": {"dataset": data, "batch_size": 4, "store": ["input_ids", "attention_mask"]},
           "hooks": {"act": {"at": "transformer.h.1.mlp.act", "type": "forward", "actions": [
               {"name": "top_examples", "k": 3, "context": 4}, {"name": "record", "rows": "token", "dtype": "float32"}]}},
           "output": {"path": str(tmp_path / "left.h5")}, "device": "cpu", "progress": False}
    path = hookrun.run(cfg).path
    ds = text(**{k: v for k, v in data.items() if k != "_target_"})
    ids = torch.stack([ds[i]["input_ids"] for i in range(len(ds))])
    mask = torch.stack([ds[i]["attention_mask"] for i in range(len(ds))])
    assert (mask[:, 0] == 0).any()  # some rows are left-padded
    model, seen = tiny_lm().eval(), []
    handle = model.transformer.h[1].mlp.act.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    with torch.no_grad():
        for lo in range(0, len(ids), 4):
            model(input_ids=ids[lo:lo + 4], attention_mask=mask[lo:lo + 4],  # (left padding: positions as generate() counts them)
                  position_ids=(mask[lo:lo + 4].cumsum(1) - 1).clamp(min=0))
    handle.remove()
    act = torch.cat(seen).numpy()
    with hookrun.open_run(path) as run:
        (sec,) = latents(run, Budget(features=16))
        checked = 0
        for entry in sec["items"][0]["features"]:
            for ex in entry["examples"]:
                s, p, at = ex["sample"], ex["position"], ex["at"]
                real = np.flatnonzero(mask[s].numpy())
                window = [q for q in real if p - 4 <= q <= p + 4]  # the context's tokens: real ones around p
                assert len(ex["acts"]) == len(window) and window[at] == p
                want = [float(act[s, q, entry["feature"]]) for q in window]
                np.testing.assert_allclose(ex["acts"], want, rtol=1e-4, atol=1e-5, err_msg=f"{entry['feature']}, {ex}")
                checked += mask[s, 0] == 0
        assert checked > 0  # left-padded samples among the examples


def test_one_inf_neither_collapses_the_thumbnails_scale_nor_turns_nan_into_zero(small_run, tmp_path):
    """An fp16 overflow (one inf) among signed maps made the scale -1 .. 1 (a one-sign map's "0 .. inf"),
    and a NaN cell took the colour of 0: the range is now the finite values' (numpy), such a cell grey
    (NO_VALUE), and the title says how many cells have no value."""
    import base64
    import io
    import shutil

    from matplotlib.colors import to_rgb
    from PIL import Image

    from hookrun.analysis.report.figure_specs import NO_VALUE, diverging_range
    from hookrun.analysis.report.run_sections import Budget, thumbnails

    path = tmp_path / "a.h5"
    shutil.copy(small_run, path)
    with h5py.File(path, "r+") as f:
        d = f["captures/fmap/block3/output"]
        a = d[0]
        a[1] -= 5
        a[0, 0, 0], a[0, 0, 1] = np.inf, np.nan
        d[0] = a
        rows = np.asarray(d[:2, :16], dtype=np.float64)
    finite = rows[np.isfinite(rows)]
    top = float(np.abs(finite).max())
    assert diverging_range(np.array([[100.0, -50.0], [3.0, np.inf]])) == (-100.0, 100.0)
    with hookrun.open_run(path) as run:
        info = next(c for c in run.captures if c.label == "fmap/block3/output")
        item = thumbnails(run, info, Budget())
    assert f"centred on 0, {-top:.3g} .. {top:.3g}: positive red" in item["title"]
    assert item["title"].endswith("(2 cells NaN or inf: grey, no value)")
    first = Image.open(io.BytesIO(base64.b64decode(item["images"][0]["src"].split(",", 1)[1]))).convert("RGB")
    k = first.size[0] // rows.shape[-1]
    grey = tuple(int(v * 255) for v in to_rgb(NO_VALUE))
    assert first.getpixel((0, 0)) == grey and first.getpixel((k, 0)) == grey  # the inf and the NaN cell
    assert first.getpixel((2 * k, 0)) != grey
    with h5py.File(path, "r+") as f:  # one sign: the scale is the finite values' min .. max, never "0 .. inf"
        d = f["captures/fmap/block3/output"]
        b = np.abs(d[:])
        b[0, 0, 0, 0] = np.inf
        d[:] = b
        rows = np.asarray(d[:2, :16], dtype=np.float64)
    finite = rows[np.isfinite(rows)]
    with hookrun.open_run(path) as run:
        item = thumbnails(run, info, Budget())
    assert f"one colour scale, {finite.min():.3g} .. {finite.max():.3g})" in item["title"]


def test_a_heatmaps_colour_bar_says_how_many_cells_have_no_value():
    z = np.array([[100.0, -50.0], [3.0, np.inf]])
    trace = to_plotly(Heatmap(z=z, title="t", label="effect", centre=0.0))["data"][0]
    top = float(np.abs(z[np.isfinite(z)]).max())
    assert (trace["zmin"], trace["zmax"]) == (-top, top)
    assert trace["colorbar"]["title"]["text"] == "effect<br><sub>1 cell NaN or inf: grey, no value</sub>"


def test_a_top_examples_carriage_return_and_esc_tokens_are_shown_as_their_escapes(tmp_path):
    """The report's latents drew each context token raw: a carriage return or an ESC from the data set
    was an empty span of no width in the browser (measured in Chromium), so an example firing on it
    showed nothing where the token is. Each is drawn as its escape (\\x0d, \\x1b); nothing else changes."""
    from hookrun.analysis.report import build_report

    lines = ["car\rret <b>x</b> end", "\x1b[31mRED\x1b[0m plain", "a\tb \x7f c"]
    (tmp_path / "evil.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = {"model": {"_target_": "hookrun.models.tiny_lm"},
           "data": {"dataset": {"_target_": "hookrun.data.text", "files": [str(tmp_path / "evil.txt")], "max_length": 24},
                    "batch_size": 3, "store": ["input_ids", "attention_mask"]},
           "hooks": {"n": {"at": "transformer.h.1.mlp.act", "type": "forward",
                           "actions": [{"name": "top_examples", "k": 3, "context": 24}]}},
           "output": {"path": str(tmp_path / "run.h5")}, "device": "cpu", "progress": False}
    path = hookrun.run(cfg).path
    with hookrun.open_run(path) as run:
        data = build_report(run).data
    items = [it for s in data["sections"] if s["id"] == "latents" for it in s["items"]]
    examples = [ex for it in items for f in it["features"] for ex in f["examples"] if ex["context"]]
    assert examples
    # the reference: each sample's text from its own bytes, each byte that does not print as \xNN
    ref = {i: "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in line) for i, line in enumerate(lines)}
    for ex in examples:
        shown = "".join(ex["context"][1:])  # (after <bos>: context 24 holds the whole line)
        assert shown == ref[ex["sample"]], (shown, ref[ex["sample"]])
        assert not any(ord(c) < 0x20 or ord(c) == 0x7F for t in ex["context"] for c in t)


def test_a_class_names_carriage_return_and_esc_are_shown_as_escapes_in_the_gradcam_captions(tmp_path):
    """A data set's class name 'car\\rret' (a folder name may hold one): the Grad-CAM caption carried it
    raw, drawn as nothing in the browser and cutting matplotlib's text there. Each caption names the
    predicted class (numpy's argmax of the file's logits) with its non-printing characters as escapes."""
    path = tmp_path / "a.h5"
    hookrun.run(hookrun.compose("experiment=shapes_gradcam", "data.dataset.size=8", "data.batch_size=8", "device=cpu",
                                "progress=false", f"output.path={path}"))
    names = ["car\rret", "\x1b[31mRED\x1b[0m", "tab\there", "plain"]
    with h5py.File(path, "r+") as f:
        f.attrs["class_names"] = json.dumps(names)
        pred = f["captures/logits/fc/output"][:].argmax(1)
    with hookrun.open_run(path) as run:
        (cams,) = run.report().data["sections"][1]["items"]
    shown = ["car\\x0dret", "\\x1b[31mRED\\x1b[0m", "tab\\x09here", "plain"]  # the reference, written out
    for k, im in enumerate(cams["images"]):
        assert f"pred {shown[pred[k]]}" in im["caption"], (im["caption"], shown[pred[k]])
        assert not any(ord(c) < 0x20 for c in im["caption"]), repr(im["caption"])
