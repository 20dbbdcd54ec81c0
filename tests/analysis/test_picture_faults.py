"""The pictures of `plot` and `report` where the file holds what they must not make up: a sample whose
logits or maps are NaN, checked against the file's numbers read with h5py and numpy."""

from __future__ import annotations

import base64
import io

import h5py
import numpy as np
import pytest
from conftest import make_cfg

import hookrun
from hookrun import open_run
from hookrun.analysis import gradcam

pytest.importorskip("matplotlib")
from hookrun.cli import sample_figures  # noqa: E402

HOOKS = {
    "fmap": {"at": "layer3", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
    "g": {"at": "layer3", "type": "tensor", "actions": ["record"]},
    "images": {"at": "", "type": "forward_pre", "actions": [{"name": "record", "what": "input"}]},
    "logits": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
}
GRAD = {"mode": "grad", "loss": {"_target_": "hookrun.runner.losses.target_logit", "_partial_": True}}
GREY = (189, 189, 189)  # NO_VALUE, #bdbdbd


@pytest.fixture
def nan_run(tmp_path, checkpoint):
    """A run whose sample 1 has NaN logits and one NaN cell in one channel of its maps (cell (1, 0))."""
    path = hookrun.run(make_cfg(tmp_path, checkpoint, HOOKS, **GRAD)).path
    with h5py.File(path, "r+") as f:
        f["captures/logits/fc/output"][1, 3] = np.nan
        row = f["captures/fmap/layer3/output"][1]
        row[5, 1, 0] = np.nan
        f["captures/fmap/layer3/output"][1] = row
    return path


def reference_cams(path, n):
    """Grad-CAM from the file with numpy: relu(sum_c mean_hw(grad)_c A_c) over the largest finite cell."""
    with h5py.File(path, "r") as f:
        act = f["captures/fmap/layer3/output"][:n].astype(np.float64)
        grad = f["captures/g/layer3/grad"][:n].astype(np.float64)
        logits = f["captures/logits/fc/output"][:n]
    cam = np.maximum(np.einsum("nc,nchw->nhw", grad.mean(axis=(2, 3)), act), 0)
    return cam / np.nanmax(cam, axis=(1, 2), keepdims=True), logits


def test_a_nan_sample_has_no_prediction_and_grey_cells_counted_in_both_commands(nan_run):
    from PIL import Image

    from hookrun.analysis.report.gradcam_section import gradcam as section

    want, logits = reference_cams(nan_run, 4)
    assert np.isnan(want[1, 1, 0]) and np.isfinite(np.delete(want.reshape(4, -1), 1 * want.shape[2] + 0, axis=1)).all()
    with open_run(nan_run) as run:
        pred = gradcam.predictions(run, np.arange(4))
        assert list(pred) == [int(np.argmax(logits[0])), "n/a", *np.argmax(logits[2:], axis=1).tolist()]
        ((_, spec),) = gradcam.pictures(run)
        html = section(run)[0]
    cams = gradcam.gradcam(*(np.asarray(a, dtype=np.float64) for a in _rows(nan_run, 4)))
    np.testing.assert_allclose(cams, want, rtol=1e-6)  # scaled by the largest finite cell (was: divided by 1)
    assert "pred n/a" in spec.captions[1] and spec.captions[1].endswith("(1 cell NaN or inf: grey, no value)")
    assert "pred n/a" not in spec.captions[0] and "NaN" not in spec.captions[0]
    # plot: the NaN cell is grey (it was transparent: white, or the picture)
    fig = sample_figures.map_row(spec)
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3]
    assert (pixels == GREY).all(-1).sum() > 5000  # (a quarter of one map: 30 without)
    # report: the same caption, the NaN cell grey (it was cast to 0: viridis' darkest)
    shown = html["items"][0]["images"] if "items" in html else _images(html)
    assert "pred n/a" in shown[1]["caption"] and shown[1]["caption"].endswith("(1 cell NaN or inf: grey, no value)")
    png = np.asarray(Image.open(io.BytesIO(base64.b64decode(shown[1]["src"].split(",", 1)[1]))).convert("RGB"))
    h, w = want.shape[1:]
    cy, cx = int((1.5 / h) * png.shape[0]), int((0.5 / w) * png.shape[1])
    assert tuple(png[cy, cx]) == GREY
    assert not (png.reshape(-1, 3) == GREY).all(-1).all()


def _rows(path, n):
    with h5py.File(path, "r") as f:
        return f["captures/fmap/layer3/output"][:n], f["captures/g/layer3/grad"][:n]


def _images(section):
    return next(item["images"] for item in section["items"] if item.get("type") == "images")


def test_plot_data_that_is_not_the_runs_is_refused_or_warned_of(tmp_path, checkpoint, capsys):
    """--data with another data set drew Grad-CAM over the wrong images with the file's captions: its
    labels at the run's samples are compared with /samples/target (h5py); with no targets in the file,
    the data config named is compared with the run's recorded one, and a difference is warned of."""
    from hookrun.cli import plot_command as plot
    from hookrun.data import RandomTensors

    hooks = {k: v for k, v in HOOKS.items() if k != "images"}
    path = hookrun.run(make_cfg(tmp_path, checkpoint, hooks, **GRAD)).path
    data = ["data=custom", "data.dataset._target_=hookrun.data.RandomTensors", "+data.dataset.n=12",
            "+data.dataset.shape=[3,32,32]", "+data.dataset.num_classes=10", "+data.dataset.seed=8"]
    with h5py.File(path, "r") as f:
        index, target = f["samples/index"][:], f["samples/target"][:]
    other = RandomTensors(n=12, shape=(3, 32, 32), num_classes=10, seed=8)
    first = next(int(i) for i, t in zip(index, target, strict=True) if int(other[int(i)][1]) != int(t))
    assert plot.main([str(path), "--out", str(tmp_path / "wrong"), "--data", *data]) == 2
    err = capsys.readouterr().err
    assert f"--data: item {first} of the data set named has label {int(other[first][1])}, but the run's sample {first} " \
           f"had target {int(target[list(index).index(first)])}: it is not the data set the run read" in err
    assert not (tmp_path / "wrong").exists()
    same = [d.replace("seed=8", "seed=7") for d in data]
    assert plot.main([str(path), "--out", str(tmp_path / "right"), "--data", *same]) == 0
    assert "--data" not in capsys.readouterr().err
    with h5py.File(path, "r+") as f:  # a file without targets: the configs are compared instead
        del f["samples/target"]
    assert plot.main([str(path), "--out", str(tmp_path / "untold"), "--data", *data]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "--data" in line] == [
        "hookrun.plot: warning: --data differs from the run's recorded data config at data.dataset.seed 8 (the run's 7); "
        "the file has no targets to check its items against: the pictures may not be the run's samples"]
    assert plot.main([str(path), "--out", str(tmp_path / "told"), "--data", *same]) == 0
    assert "--data" not in capsys.readouterr().err


def test_plot_data_check_reads_a_bounded_spread_of_a_long_runs_items():
    """--data's label check read every sample's item (a 50,000-image run loaded its data set whole
    before drawing eight maps): at most CHECKED items, evenly spread, the first and last among them,
    and a data set that differs at one of them is still refused."""
    from types import SimpleNamespace

    from hookrun.errors import ConfigError

    class Counted:
        def __init__(self, labels):
            self.labels, self.read = labels, []

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, i):
            self.read.append(i)
            return np.zeros((3, 2, 2), np.float32), int(self.labels[i])

    n = 5000
    labels = np.random.default_rng(0).integers(0, 10, n)
    run = SimpleNamespace(samples=np.arange(n), targets=labels.copy(), config={})
    same = Counted(labels)
    assert sample_figures.check_same_data(same, run, {}) == ""
    assert len(same.read) == sample_figures.CHECKED and {0, n - 1} <= set(same.read)
    wrong = labels.copy()
    wrong[same.read[100]] = (wrong[same.read[100]] + 1) % 10
    with pytest.raises(ConfigError, match=f"item {same.read[100]} of the data set named has label"):
        sample_figures.check_same_data(Counted(wrong), run, {})


def test_curves_over_steps_get_no_histogram_in_plot_or_report(tmp_path, capsys):
    """Deletion and insertion curves (dims sample, step, as the file's `dims` attribute says) were drawn
    as histograms of their points; they are left out, and said so, in plot and report, where the
    per-sample numbers beside them (deletion_area, prob) keep theirs. (An SAE's curves, dims (step,),
    take the same rule.)"""
    from hookrun.analysis.report import build_report
    from hookrun.cli import plot_command as plot

    path = tmp_path / "a.h5"
    hookrun.run({"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
                 "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 4}, "batch_size": 4}, "output": {"path": str(path)},
                 "attribution": {"method": "saliency", "measure": {"deletion": 4, "insertion": 4}}})
    with h5py.File(path, "r") as f:
        group = f["captures/attribution/__model__"]
        curves = {n for n in group if list(group[n].attrs.get("dims", []))[-1:] == ["step"]}
        numbers = {n for n in group if list(group[n].attrs.get("dims", [])) == ["sample"] and group[n].dtype.kind == "f"}
    assert {"deletion", "insertion"} <= curves and {"deletion_area", "prob"} <= numbers
    with open_run(path) as run:
        written = {p.name for p in plot.plot_run(run, tmp_path / "fig")}
        report = build_report(run).data
    assert not {f"hist_attribution__model__{n}.png" for n in curves} & written
    assert {f"hist_attribution__model__{n}.png" for n in numbers} <= written
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("not drawn: the histogram of attribution/(model)/deletion,"))
    assert line.endswith(": a curve's points over steps (counters, learning rate, deletion or insertion), not a distribution")
    note = str(next(s for s in report["sections"] if s["id"] == "captures"))
    assert "histogram of attribution/(model)/deletion" in note and "a curve's points over steps" in note


def test_a_row_of_long_sample_titles_do_not_run_into_each_other(tmp_path):
    """Grad-CAM's titles name each sample's predicted and target class; with long class names (ImageNet's,
    an image folder's) fit_titles kept each title inside the figure only, so the four titles of a row were
    drawn over each other. Measured: each title's drawn box lies between its neighbours' boxes."""
    from hookrun.cli import figures

    names = ["#0 · pred great white shark, white shark, man-eater · target tiger shark, Galeocerdo cuvieri",
             "#1 · pred hammerhead, hammerhead shark · target electric ray, crampfish, numbfish, torpedo",
             "#2 · pred goldfish, Carassius auratus · target tench, Tinca tinca", "#3 · pred cock · target hen"]

    def draw(ax, k):
        ax.set_title(names[k])
        return ax.imshow(np.zeros((4, 4)), vmin=0, vmax=1)

    fig = figures.image_row(4, draw, "a run · Grad-CAM at layer4", "Grad-CAM")
    figures.save(fig, tmp_path / "row.png")
    fig.canvas.draw()
    boxes = [ax.title.get_window_extent() for ax in fig.axes[:4]]
    assert [ax.title.get_text().replace("\n", " ") for ax in fig.axes[:4]] == names  # wrapped, every word kept
    for left, right in zip(boxes, boxes[1:], strict=False):
        assert left.x1 <= right.x0, (left, right)
    assert all(fig.bbox.x0 <= b.x0 and b.x1 <= fig.bbox.x1 for b in boxes)
