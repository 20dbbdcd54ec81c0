"""The report of attribution runs (issue 39 item 4): each map over its recorded input image on the diverging
scale centred on zero (the PNG's pixels equal numpy's blend of the file's attribution summed over
channels with the recorded image), captions with the data set's class names, the curves' areas equal to
numpy's trapezoid over the file's curves, and a sweep over methods compared in one table and one chart
per curve with each job's own areas. One in-process run per method, made once for the module."""

from __future__ import annotations

import base64
import io
import json

import h5py
import numpy as np
import pytest
import yaml
from headless_browser import chromium, open_page, sections

import hookrun
from hookrun.analysis.report import build_report
from hookrun.analysis.report.figure_specs import DIVERGING

pytest.importorskip("captum.attr")

browser = pytest.fixture(scope="module")(chromium)  # headless Chromium, no network
N, B = 8, 4
METHODS = ("saliency", "integrated_gradients", "occlusion")
HOOKS = {"images": {"at": "", "type": "forward_pre", "actions": [{"name": "record", "what": "input"}]},
         "logits": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


def cfg(path, method):
    return {"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
            "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": N}, "batch_size": B},
            "output": {"path": str(path)}, "hooks": HOOKS,
            "attribution": {"method": method, "steps": 4, "window": [1, 8, 8], "strides": [1, 8, 8],
                            "measure": {"deletion": 4, "insertion": 5}}}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep folder as Hydra's multirun leaves it: one job per method, its overrides and its file."""
    root = tmp_path_factory.mktemp("methods")
    for job, method in enumerate(METHODS):
        folder = root / str(job)
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"attribution.method={method}"]))
        hookrun.run(cfg(folder / "captures.h5", method))
    return root


def page_of(path):
    with hookrun.open_run(path) as run:
        return build_report(run).data


def section(data, sid):
    return next(s for s in data["sections"] if s["id"] == sid)


def decode(src):
    from PIL import Image

    assert src.startswith("data:image/png;base64,")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("RGB"), dtype=np.float64)


def test_overlays_are_the_files_maps_over_the_recorded_images(sweep):
    from matplotlib.colors import LinearSegmentedColormap

    path = sweep / "1" / "captures.h5"  # integrated gradients: maps of both signs
    images = section(page_of(path), "attribution")["items"][0]
    with h5py.File(path) as f:
        attr = f["captures/attribution/__model__/attribution"][:].astype(np.float64)
        target = f["captures/attribution/__model__/target"][:]
        index = f["samples/index"][:]
        x = f["captures/images/__model__/input"][:].astype(np.float64)
        logits = f["captures/logits/fc/output"][:]
    assert images["type"] == "images" and len(images["images"]) == N + 1 and images["images"][-1]["colorbar"]  # the maps, their colour bar
    cmap = LinearSegmentedColormap.from_list("ref", list(DIVERGING))
    names = ("circle", "square", "triangle", "cross")
    for k, im in enumerate(images["images"][:N]):
        m = attr[k].sum(0)  # numpy: summed over channels
        lo, hi = im["scale"]
        assert lo == pytest.approx(-np.abs(m).max()) and hi == pytest.approx(np.abs(m).max())  # centred on zero
        grey = (x[k, 0] - x[k, 0].min()) / (x[k, 0].max() - x[k, 0].min())
        alpha = (0.35 + 0.65 * np.abs(m) / hi)[..., None]  # opaque at the largest |value|
        want = (1 - alpha) * grey[..., None] + alpha * cmap((m - lo) / (hi - lo))[..., :3]
        got = decode(im["src"])
        step = got.shape[0] // m.shape[0]
        np.testing.assert_allclose(got[::step, ::step] / 255, want, atol=1.5 / 255)
        assert im["sample"] == index[k]
        assert f"target {names[target[k]]}" in im["caption"] and f"pred {names[logits[k].argmax()]}" in im["caption"]


def test_curve_areas_on_the_page_are_numpys_trapezoid(sweep):
    path = sweep / "0" / "captures.h5"
    items = section(page_of(path), "attribution")["items"]
    summary, per = (i for i in items if i["type"] == "table")
    with h5py.File(path) as f:
        curves = {w: f[f"captures/attribution/__model__/{w}"][:] for w in ("deletion", "insertion")}
    areas = {w: np.trapezoid(c, np.linspace(0, 1, c.shape[1]), axis=1) for w, c in curves.items()}
    assert [r[0] for r in summary["rows"]] == ["deletion", "insertion"]
    for row in summary["rows"]:
        assert row[1] == pytest.approx(areas[row[0]].mean(), rel=1e-5)
    for k, row in enumerate(per["rows"]):
        assert row[2] == pytest.approx(areas["deletion"][k], rel=1e-5) and row[3] == pytest.approx(areas["insertion"][k], rel=1e-5)
    figs = next(i for i in items if i["type"] == "figures")["figures"]
    for fig, w in zip(figs, ("deletion", "insertion"), strict=True):
        mean = next(t for t in fig["figure"]["data"] if str(t.get("name", "")).startswith("mean"))
        np.testing.assert_allclose(mean["y"], curves[w].mean(0), rtol=1e-9)
        grey = [t for t in fig["figure"]["data"] if t.get("line", {}).get("color") == "#999999"]
        assert len(grey) == N  # every sample behind the band, the mean and the random order
        assert len(fig["figure"]["data"]) == N + 4


def test_sweep_page_compares_the_methods(sweep):
    data = build_report(hookrun.open_sweep(sweep)).data
    assert [s["id"] for s in data["sections"]] == ["attribution-methods", "sweep"]
    table, figs = section(data, "attribution-methods")["items"]
    cols = table["columns"]
    assert [r[cols.index("method")] for r in table["rows"]] == list(METHODS)
    for job, row in enumerate(table["rows"]):
        with h5py.File(sweep / str(job) / "captures.h5") as f:
            assert json.loads(f.attrs["attribution"])["method"] == METHODS[job]
            for w in ("deletion", "insertion"):
                c = f[f"captures/attribution/__model__/{w}"][:]
                assert row[cols.index(f"{w} area")] == pytest.approx(np.trapezoid(c, np.linspace(0, 1, c.shape[1]), axis=1).mean(), rel=1e-5)
    for fig in figs["figures"]:  # one chart per curve, one line per method
        assert [t["name"].split(" (")[0] for t in fig["figure"]["data"]] == list(METHODS)


@pytest.mark.slow
def test_pages_draw_in_a_browser(browser, sweep, tmp_path):
    """Both pages in headless Chromium: no console error, nothing loaded from the network, every overlay
    decoded, the curves drawn (tests/helpers/headless_browser.py)."""
    driver = browser
    with hookrun.open_run(sweep / "1") as run:
        page = build_report(run).save(tmp_path / "run.html")
    open_page(driver, page)
    assert "section-attribution" in sections(driver)
    widths = driver.execute_script("return Array.from(document.querySelectorAll('#section-attribution img')).map(i => i.naturalWidth)")
    assert len(widths) == N + 1 and min(widths) > 0  # the maps and their colour bar
    assert driver.execute_script("return document.querySelectorAll('#section-attribution .plot').length") == 2
    driver.execute_script("document.getElementById('section-attribution').scrollIntoView()")
    driver.save_screenshot(str(tmp_path / "run.png"))
    page = build_report(hookrun.open_sweep(sweep)).save(tmp_path / "sweep.html")
    open_page(driver, page)
    assert sections(driver) == ["section-attribution-methods", "section-sweep"]
    names = driver.execute_script("return Array.from(document.querySelectorAll('#section-attribution-methods .plot'))"
                                  ".map(p => p.data.map(t => t.name.split(' (')[0]))")
    assert names == [list(METHODS)] * 2
    driver.save_screenshot(str(tmp_path / "sweep.png"))  # (to look at: --basetemp)


def test_top_examples_of_a_conv_layer_show_each_channels_map_over_its_images(tmp_path):
    """top_examples on tiny_cnn's block3.0: each channel's top samples carry a picture, and the map under it
    is that sample's channel from a raw forward hook on the same weights and image."""
    import torch

    from hookrun.analysis.report.latents import ChannelImages, _latent_capture
    from hookrun.data.shapes import shapes
    from hookrun.models.tiny_cnn import tiny_cnn

    c = cfg(tmp_path / "top.h5", "saliency")
    del c["attribution"]
    c["hooks"] = {"images": HOOKS["images"], "conv": {"at": "block3.0", "type": "forward",
                                                      "actions": [{"name": "top_examples", "k": 3}, "record"]}}
    hookrun.run(c)
    model, data, seen = tiny_cnn().eval(), shapes(N), {}
    model.block3[0].register_forward_hook(lambda m, i, o: seen.__setitem__("out", o))
    with hookrun.open_run(tmp_path / "top.h5") as run:
        latents = section(build_report(run).data, "latents")["items"][0]
        pics = ChannelImages.of(run, _latent_capture(run, "block3.0"))  # what the section draws
        hist = next(f for f in latents["features"] if f["feature"] == 0)["hist"]["data"][0]
        assert max(hist["x"]) <= run.file["captures/conv/block3.0/output"][:, 0].max()  # the channel's own values
        assert max(hist["x"]) > run.file["captures/conv/block3.0/output"][:, 0].max() - 2 * (hist["x"][1] - hist["x"][0])
        assert latents["module"] == "block3.0" and latents["features"]
        for f in latents["features"][:4]:
            assert len(f["examples"]) == 3
            for ex in f["examples"]:
                with torch.no_grad():
                    model(data[ex["sample"]][0][None])
                want = seen["out"][0, f["feature"]].double().numpy()
                assert ex["value"] == pytest.approx(want.max(), rel=1e-5)  # the channel's max over H, W
                np.testing.assert_allclose(pics.channel(ex["sample"], f["feature"]), want, rtol=1e-5, atol=1e-6)
                assert decode(ex["src"]).shape[:2] == (128, 128)  # the 32 x 32 image, scaled up


def test_overlays_with_fewer_images_recorded_show_those_over_them(tmp_path):
    """The input recorded for 3 samples (limit 3): the section said "no input image recorded" and
    drew 8 bare maps; now the first 3, each over its own recorded image (h5py's rows, in grey)."""
    from matplotlib.colors import LinearSegmentedColormap

    c = cfg(tmp_path / "a.h5", "saliency")
    c["hooks"] = {**HOOKS, "images": {**HOOKS["images"], "actions": [{"name": "record", "what": "input", "limit": 3}]}}
    hookrun.run(c)
    images = section(page_of(tmp_path / "a.h5"), "attribution")["items"][0]
    assert "no input image" not in images["title"] and "first 3 samples; the input image was recorded" in images["title"]
    assert len(images["images"]) == 3 + 1 and images["images"][-1]["colorbar"]
    with h5py.File(tmp_path / "a.h5") as f:
        attr = f["captures/attribution/__model__/attribution"][:3].astype(np.float64)
        x = f["captures/images/__model__/input"][:].astype(np.float64)
    cmap = LinearSegmentedColormap.from_list("ref", list(DIVERGING))
    for k, im in enumerate(images["images"][:3]):
        m = attr[k].sum(0)
        lo, hi = im["scale"]
        grey = (x[k, 0] - x[k, 0].min()) / (x[k, 0].max() - x[k, 0].min())
        alpha = (0.35 + 0.65 * np.abs(m) / hi)[..., None]
        want = (1 - alpha) * grey[..., None] + alpha * cmap((m - lo) / (hi - lo))[..., :3]
        got = decode(im["src"])
        step = got.shape[0] // m.shape[0]
        np.testing.assert_allclose(got[::step, ::step] / 255, want, atol=1.5 / 255)


def test_a_sweep_page_marks_a_failed_job_and_names_those_with_no_row(sweep, tmp_path):
    """A job whose file says failed was compared as a method like the others (its partial rows' areas under
    its bare method name), and a refused job was left out without a word. Reference: each job's status by
    h5py and its folder's refused.txt."""
    import shutil

    root = tmp_path / "sw"
    for job in ("0", "1"):
        shutil.copytree(sweep / job, root / job)
    with h5py.File(root / "1" / "captures.h5", "r+") as f:
        f.attrs["status"] = "failed"
    (root / "2" / ".hydra").mkdir(parents=True)
    (root / "2" / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["attribution.method=occlusion"]))
    (root / "2" / "refused.txt").write_text("attribution.window: ...\n")
    attr = section(build_report(hookrun.open_sweep(root)).data, "attribution-methods")
    table = attr["items"][0]
    assert [r[table["columns"].index("method")] for r in table["rows"]] == ["saliency", "integrated_gradients"]
    assert "integrated_gradients (failed)" in str(attr["items"][1]) and "job 2 refused: no row" in attr["note"]


def test_a_class_names_carriage_return_and_esc_are_shown_as_escapes_in_the_captions(tmp_path):
    """A data set's class name with a carriage return, an ESC or a tab (a folder name may hold one)
    went into the overlays' captions raw: the browser draws them as nothing ('[31mRED'). Each caption
    names the target (the file's labels) with those characters as escapes, the rest as written."""
    path = tmp_path / "a.h5"
    hookrun.run(hookrun.compose("experiment=attribution_shapes", "data.dataset.size=8", "attribution.steps=4",
                                "device=cpu", "progress=false", f"output.path={path}"))
    with h5py.File(path, "r+") as f:
        meta = json.loads(f.attrs["attribution"])
        meta["class_names"] = ["car\rret", "\x1b[31mRED", "tab\there", "plain"]
        f.attrs["attribution"] = json.dumps(meta)
    shown = ["car\\x0dret", "\\x1b[31mRED", "tab\\x09here", "plain"]  # the reference, written out
    with hookrun.open_run(path) as run:
        targets = run.attribution()["target"].values
        (over,) = [it for s in build_report(run).data["sections"] for it in s["items"] if it.get("type") == "images"][:1]
    captions = [im["caption"] for im in over["images"] if not im.get("colorbar")]
    assert captions
    for k, caption in enumerate(captions):
        assert f"target {shown[int(targets[k])]} " in caption, (caption, shown[int(targets[k])])
        assert not any(ord(c) < 0x20 for c in caption), repr(caption)
