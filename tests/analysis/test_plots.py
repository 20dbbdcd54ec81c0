"""Plots: the files exist, and the figures' properties read back (one colour bar and one colour
scale per figure, axis labels, tick labels that do not overlap, categorical sweep axes); reading a
file never builds what its config names."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from conftest import batches, make_cfg

import hookrun
from hookrun import open_run
from hookrun.analysis import gradcam

pytest.importorskip("matplotlib")
from hookrun.cli import figures, sample_figures  # noqa: E402
from hookrun.cli import plot_command as plot  # noqa: E402

HOOKS = {
    "fmap": {"at": "layer3", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
    "g": {"at": "layer3", "type": "tensor", "actions": ["record"]},
    "images": {"at": "", "type": "forward_pre", "actions": [{"name": "record", "what": "input", "limit": 4}]},
    "logits": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
}
GRAD = {"mode": "grad", "loss": {"_target_": "hookrun.runner.losses.target_logit", "_partial_": True}}


@pytest.fixture
def grad_run(tmp_path, checkpoint):
    return hookrun.run(make_cfg(tmp_path, checkpoint, HOOKS, **GRAD)).path


def colorbars(fig) -> list:
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def no_overlap(fig, axis) -> bool:
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
    return all(not a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_feature_grid_has_one_colour_scale_and_one_colour_bar(grad_run):
    with open_run(grad_run) as run:
        maps = run["layer3", "output"][:2, :16]
    fig = figures.feature_grid(maps, ["sample #0", "sample #1"], "r · hook fmap · layer3 · output")
    assert len(colorbars(fig)) == 1
    clims = {im.get_clim() for ax in fig.axes for im in ax.images}
    assert clims == {(float(maps.min()), float(maps.max()))}
    assert fig._suptitle.get_text() == "r · hook fmap · layer3 · output"
    assert colorbars(fig)[0].get_ylabel()


def test_histogram_of_small_values_has_labels_and_readable_ticks():
    values = np.random.default_rng(0).normal(0, 3e-5, 20_000)
    fig = figures.histogram(values, {"mean": 0.0, "std": 3e-5, "zeros": 0.0}, "title", "grad value")
    (ax,) = fig.axes
    assert ax.get_xlabel() == "grad value" and ax.get_ylabel().startswith("count")
    assert len([t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]) <= 6
    assert no_overlap(fig, ax.xaxis)
    assert "10^{" in ax.xaxis.get_offset_text().get_text() or "times" in ax.xaxis.get_offset_text().get_text()


@pytest.mark.parametrize(("z", "extend"), [([[1 + 2e-16, 0.4], [0.4, 1.0]], "neither"), ([[1.0, -0.03], [-0.03, 1.0]], "min"),
                                           ([[1.02, 0.5], [0.5, np.nan]], "max")])
def test_a_value_beyond_a_fixed_colour_range_points_off_the_bar(z, extend):
    """Minibatch CKA's unbiased estimate can fall below 0 (or above 1): its cell takes the end colour,
    and the colour bar's arrow says a value lies beyond it."""
    from hookrun.analysis.report.figure_specs import Heatmap

    fig = figures.heatmap(Heatmap(z=np.array(z), title="t", range=(0.0, 1.0)))
    assert fig.axes[0].images[0].colorbar.extend == extend


def test_sweep_axis_is_categorical_for_seeds_and_a_scale_for_floats():
    fig = figures.sweep_lines([2, 0, 1], {"a": [3.0, 1.0, 2.0]}, "seed", "std", "t")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
    assert list(ax.lines[0].get_ydata()) == [1.0, 2.0, 3.0]  # sorted by seed
    assert ax.get_xlabel() == "seed" and ax.get_ylabel() == "std"
    fig = figures.sweep_lines([0, 0.5, 1], {"a": [1.0, 2.0, 3.0]}, "params.factor", "std", "t")
    assert list(fig.axes[0].lines[0].get_xdata()) == [0.0, 0.5, 1.0]  # positions are the values


def test_a_few_swept_floats_are_the_axis_ticks_in_plot_and_report():
    """C = 1 and 2.5: the ticks are 1 and 2.5 (matplotlib's own began at 1.2); crowded or many values
    keep the axis's own ticks, and a log axis its decades."""
    from hookrun.analysis.report import plotly_figures
    from hookrun.analysis.report.figure_specs import Lines

    ax = figures.sweep_lines([2.5, 1.0], {"a": [2.0, 1.0]}, "probe.C", "acc", "t").axes[0]
    assert list(ax.get_xticks()) == [1.0, 2.5]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2.5"]
    layout = plotly_figures.lines(Lines([2.5, 1.0], {"a": [2.0, 1.0]}, "probe.C", "acc", "t"))["layout"]
    assert layout["xaxis"]["tickvals"] == [1.0, 2.5] and layout["xaxis"]["ticktext"] == ["1", "2.5"]
    crowded = [0.0, 0.01, 1.0]  # (0 and 0.01 would print over each other)
    ax = figures.sweep_lines(crowded, {"a": [1.0, 2.0, 3.0]}, "x", "y", "t").axes[0]
    assert len(ax.get_xticks()) > 3
    assert "tickvals" not in plotly_figures.lines(Lines(crowded, {"a": [1.0, 2.0, 3.0]}, "x", "y", "t"))["layout"]["xaxis"]
    many = [float(i) for i in range(20)]
    assert len(figures.sweep_lines(many, {"a": many}, "x", "y", "t").axes[0].get_xticks()) < 12
    decades = [0.01, 0.1, 1.0, 10.0]
    ax = figures.lines(Lines(decades, {"a": [1.0, 2.0, 3.0, 4.0]}, "C", "acc", "t", log_x=True)).axes[0]
    assert ax.get_xscale() == "log"


def test_gradcam_names_classes_and_takes_images_from_the_file(grad_run, reference_model, dataset, tmp_path):
    x, y = next(batches(dataset))
    with torch.no_grad():
        pred = reference_model(x).argmax(1).numpy()
    with open_run(grad_run) as run:
        idx = np.arange(4)
        np.testing.assert_array_equal(gradcam.predictions(run, idx), pred)
        np.testing.assert_array_equal(gradcam.targets(run, idx), y.numpy())
        np.testing.assert_allclose(gradcam.recorded_images(run, idx), x.numpy())
        written = plot.plot_run(run, tmp_path / "fig")
    assert {p.name for p in written} >= {"gradcam_layer3.png", "fmap_fmap__layer3__output.png", "hist_logits__fc__output.png"}
    assert all(p.stat().st_size > 5000 for p in written)


def test_plot_main_lists_the_files_and_never_builds_from_the_file(grad_run, tmp_path, capsys):
    marker = tmp_path / "emptied.txt"
    with h5py.File(grad_run, "r+") as f:  # a config naming code to run: plotting must not run it
        config = yaml.safe_load(f.attrs["config"])
        config["data"]["dataset"] = {"_target_": "builtins.open", "file": str(marker), "mode": "w"}
        f.attrs["config"] = yaml.safe_dump(config)
    assert plot.main([str(grad_run), "--out", str(tmp_path / "fig")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"wrote {len(out) - 1} figure(s) to {tmp_path / 'fig'}:"
    assert len(out) > 5 and all(Path(line.strip()).is_file() for line in out[1:])
    assert not marker.exists()


def test_gradcam_images_from_a_dataset_named_on_the_command_line(tmp_path, checkpoint, dataset, monkeypatch, capsys):
    hooks = {k: v for k, v in HOOKS.items() if k != "images"}
    path = hookrun.run(make_cfg(tmp_path, checkpoint, hooks, **GRAD)).path
    seen = {}
    draw = sample_figures.map_row

    def spy(spec):
        seen["images"], seen["captions"] = spec.pictures, spec.captions
        return draw(spec)

    monkeypatch.setattr(sample_figures, "map_row", spy)
    data = ["data=custom", "data.dataset._target_=hookrun.data.RandomTensors", "+data.dataset.n=12",
            "+data.dataset.shape=[3,32,32]", "+data.dataset.num_classes=10", "+data.dataset.seed=7"]
    assert plot.main([str(path), "--out", str(tmp_path / "fig"), "--data", *data]) == 0
    x = dataset[2][0].numpy()
    want = np.moveaxis((x - x.min()) / (x.max() - x.min()), 0, -1)
    np.testing.assert_allclose(seen["images"][2], want, atol=1e-6)
    assert seen["captions"][2].startswith("#2 · pred ") and seen["captions"][2].endswith(f"target {int(dataset[2][1])}")
    # a data set with fewer items than the run read: one line before any figure (it was IndexError after some)
    small = [d.replace("n=12", "n=2") for d in data]
    assert plot.main([str(path), "--out", str(tmp_path / "small"), "--data", *small]) == 2
    assert "--data: the run's samples go up to index 11, past the 2 items" in capsys.readouterr().err
    assert not (tmp_path / "small").exists()
    # a sweep's options on one run were ignored in silence
    for option in (["--x", "params.f"], ["--stat", "max"]):
        assert plot.main([str(path), "--out", str(tmp_path / "one"), *option]) == 2
        assert f"{option[0]} draws a sweep's jobs against each other; {path} is one run" in capsys.readouterr().err


def test_the_whole_model_and_a_submodule_named_model_get_a_picture_each(tmp_path):
    """One hook at the whole model ('' , file name `model`) and at its submodule named `model`: two
    files whose pixels are their own captures' (the second was drawn over the first before)."""

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            return self.model(x) * 100.0  # (the whole model's maps are not the submodule's)

    torch.manual_seed(0)
    data = [(torch.rand(3, 8, 8), 0) for _ in range(2)]
    hooks = {"h": {"at": ["", "model"], "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    path = hookrun.run({"hooks": hooks, "data": {"batch_size": 2}, "progress": False,
                        "output": {"path": str(tmp_path / "w.h5")}}, model=Wrapper().eval(), dataset=data).path
    with open_run(path) as run:
        written = plot.plot_run(run, tmp_path / "fig")
        whole, sub = run["h", "", "output"][()], run["h", "model", "output"][()]
    names = sorted(p.name for p in written)
    assert len(set(written)) == len(written) and all(p.is_file() for p in written), names
    fmaps = sorted(p for p in written if p.name.startswith("fmap_h__model__output"))
    assert [p.name for p in fmaps] == ["fmap_h__model__output.2.png", "fmap_h__model__output.png"], names
    assert abs(float(whole.max()) - 100 * float(sub.max())) < 1e-3 * abs(float(whole.max()))
    assert fmaps[0].read_bytes() != fmaps[1].read_bytes()


def test_maps_with_an_inf_are_drawn_and_counts_are_at_least_one(tmp_path, grad_run, capsys):
    """A map with -inf cells (log of a ReLU) varies over space: it was left out as 'one value over
    space'; and --samples / --channels below 1 are refused in one line (they drew 7 of 8 samples for
    -1), with no folder left behind by a plot that could not start."""
    from hookrun.analysis.report.figure_specs import constant_over_space

    maps = np.random.default_rng(0).normal(size=(2, 3, 4, 4))
    maps[0, 0, 1, 1] = -np.inf
    assert not constant_over_space(maps) and not constant_over_space(maps[:0])
    assert constant_over_space(np.broadcast_to(np.arange(3.0)[None, :, None, None], (2, 3, 4, 4)))
    for flag in ("--samples", "--channels"):
        with pytest.raises(SystemExit) as stop:
            plot.main([str(grad_run), flag, "0"])
        assert stop.value.code == 2
        assert "give a whole number of at least 1" in capsys.readouterr().err
    assert plot.main([str(tmp_path / "no" / "such" / "run.h5")]) == 2
    assert not (tmp_path / "no").exists()


def test_one_inf_in_signed_maps_keeps_plots_colour_scale_of_the_finite_values(grad_run):
    """An inf among maps of both signs made the diverging scale -1 .. 1 (values ran -5 .. 35): the
    scale reaches the finite value furthest from 0 (numpy), the inf cell is grey, the title says so."""
    from matplotlib.colors import to_rgba

    from hookrun.analysis.report.figure_specs import NO_VALUE, Heatmap

    with open_run(grad_run) as run:
        maps = np.array(run["layer3", "output"][:2, :16], dtype=np.float64)
    maps[0, 1] -= 5
    maps[0, 0, 0, 0] = np.inf
    top = float(np.abs(maps[np.isfinite(maps)]).max())
    fig = figures.feature_grid(maps, ["sample #0", "sample #1"], "r · hook fmap · layer3 · output")
    assert {im.get_clim() for ax in fig.axes for im in ax.images} == {(-top, top)}
    assert fig._suptitle.get_text() == "r · hook fmap · layer3 · output (1 cell NaN or inf: grey, no value)"
    assert {ax.get_facecolor() for ax in fig.axes if ax.images} == {to_rgba(NO_VALUE)}
    z = np.array([[100.0, -50.0], [3.0, np.inf]])
    fig = figures.heatmap(Heatmap(z=z, title="t", centre=0.0, label="effect"))
    assert fig.axes[0].images[0].get_clim() == (-100.0, 100.0)
    assert colorbars(fig)[0].get_ylabel() == "effect\n(1 cell NaN or inf: grey, no value)"


def test_grad_cam_pictures_show_the_samples_asked(grad_run):
    with open_run(grad_run) as run:
        (_, one), = gradcam.pictures(run, 1)
        (_, default), = gradcam.pictures(run)
    assert len(one.maps) == 1 and len(default.maps) == min(gradcam.SAMPLES, 4)


def test_plot_removes_the_figures_of_a_replaced_run_and_nothing_else(grad_run, tmp_path, checkpoint, capsys):
    """A run replaced in its file (output.overwrite) left its old PNGs in figures/, each naming the
    current file in its metadata: they looked current. Plot removes exactly those, and says so."""
    from PIL import Image

    out = tmp_path / "fig"
    assert plot.main([str(grad_run), "--out", str(out)]) == 0
    first = {p.name for p in out.glob("*.png")}
    assert {"gradcam_layer3.png", "hist_g__layer3__grad.png"} <= first
    Image.new("RGB", (4, 4)).save(out / "mine.png")  # a user's PNG: no metadata
    Image.new("RGB", (4, 4)).save(out / "other.png", pnginfo=_png_info(Source="/elsewhere/captures.h5", Run="x"))
    hooks = {k: v for k, v in HOOKS.items() if k not in ("g", "images")}
    hookrun.run(make_cfg(tmp_path, checkpoint, hooks, **{**GRAD, "output.overwrite": True}))
    capsys.readouterr()
    assert plot.main([str(grad_run), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    now = {p.name for p in out.glob("*.png")}
    listed = {Path(line.strip()).name for line in lines if line.startswith("  ")}
    assert now == listed | {"mine.png", "other.png"}, now - listed
    gone = first - now
    assert {"gradcam_layer3.png", "hist_g__layer3__grad.png", "fmap_images__model__input.png"} <= gone
    assert f"removed {len(gone)} figures of the replaced run" in lines


def _png_info(**text):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for k, v in text.items():
        info.add_text(k, v)
    return info


def test_a_normalised_input_comes_back_as_the_raw_image(tmp_path, capsys):
    """A photo normalised by its data set (torchvision Normalize, ImageNet's mean and std) was drawn
    min-max scaled over all channels at once: mid-grey came out blue-tinted. The run writes the data
    set's mean and std; the pictures undo them exactly (the raw image, before Normalize, to 1e-6)."""
    from torchvision import transforms

    from hookrun.data import IMAGENET_MEAN, IMAGENET_STD

    class Photos(torch.utils.data.Dataset):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.raw = rng.uniform(0, 1, size=(4, 8, 8, 3)).astype(np.float32)
            self.raw[0] = 0.5  # mid-grey
            self.transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return self.transform(self.raw[i]), i % 3

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(4, 3)).eval()
    hooks = {"fmap": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "g": {"at": "0", "type": "tensor", "actions": ["record"]},
             "images": {"at": "", "type": "forward_pre", "actions": [{"name": "record", "what": "input"}]},
             "top": {"at": "0", "type": "forward", "actions": [{"name": "top_examples", "k": 2}]}}
    data = Photos()
    path = hookrun.run({"hooks": hooks, "data": {"batch_size": 2}, "progress": False, **GRAD,
                        "output": {"path": str(tmp_path / "p.h5")}}, model=model, dataset=data).path
    with open_run(path) as run:
        ((_, spec),) = gradcam.pictures(run)
        from hookrun.analysis.report.gradcam_section import gradcam as section

        title = section(run)[0]["items"][0]["title"]
        from hookrun.analysis.report.latents import ChannelImages, _latent_capture

        latents = ChannelImages.of(run, _latent_capture(run, "0"))  # (the report's top examples over their images)
        drawn = [latents.picture(k) for k in range(4)]
    for k in range(4):
        np.testing.assert_allclose(spec.pictures[k], data.raw[k], atol=1e-6)
        np.testing.assert_allclose(drawn[k], data.raw[k], atol=1e-6)
    assert "min-max" not in spec.title and "min-max" not in title
    # an old file (no such attribute): min-max scaled, as before, and the titles say so
    with h5py.File(path, "r+") as f:
        del f.attrs["input_normalize"]
        x = f["captures/images/__model__/input"][1].astype(np.float64)
    with open_run(path) as run:
        ((_, spec),) = gradcam.pictures(run)
    np.testing.assert_allclose(spec.pictures[1], np.moveaxis((x - x.min()) / (x.max() - x.min()), 0, -1), atol=1e-6)
    assert "min-max" in spec.title


def emptied(path, keep=()):
    """The file as a run stopped before its first batch leaves it: its captures with 0 rows (h5py)."""
    with h5py.File(path, "r+") as f:
        f["captures"].visititems(lambda n, o: o.resize(0, axis=0) if isinstance(o, h5py.Dataset) and o.maxshape[0] is None
                                 and not n.startswith(keep) else None)
        f.attrs["status"] = "interrupted"
    return path


def test_captures_with_no_rows_are_named_not_drawn(grad_run, tmp_path, capsys):
    """0-row captures crashed plot (matplotlib: 'Number of rows must be a positive integer, not 0')
    and the Grad-CAM picture ('cannot reshape array of size 0'): each is a 'not drawn' line; a file
    with nothing else is one line and status 2."""
    part = emptied(grad_run, keep=("logits",))
    assert plot.main([str(part), "--out", str(tmp_path / "fig")]) == 0
    out = capsys.readouterr().out
    assert "no rows written" in out and "g/layer3/grad" in out.split("no rows written")[0].splitlines()[-1], out
    assert {p.name for p in (tmp_path / "fig").glob("*.png")} == {"hist_logits__fc__output.png"}
    assert plot.main([str(emptied(grad_run)), "--out", str(tmp_path / "none")]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "nothing could be drawn" in err and "Traceback" not in err, err
    assert "no rows written" in out and not (tmp_path / "none").exists()
