"""Grad-CAM pictures of `python -m hookrun.plot`: a layer's maps and their gradient, over the input images
(the maps, images and classes are read by analysis/gradcam.py, which the report shares).

    pairs = gradcam_pairs(run)                        # (activation, gradient) captures of one module
    gradcam_figure(run, *pairs[0], out=Path("figures"))

The map of a sample is relu(sum_c mean_hw(grad)_c * A_c) (Selvaraju et al.), scaled to [0, 1].
The input images come from the file itself where the run recorded them, else from a dataset the
user names on the command line; each sample is captioned with its predicted class (a recorded
logits capture) and target, by the data set's class names where the run wrote them (`class_names`).

An attribution run's pictures (attribution_figures, below; [] for a run of another kind): each map is
the attribution summed over channels (a layer's map resized to the image, bilinear), drawn with one
diverging colour scale centred on zero per sample (red: for the target, blue: against), as a
translucent overlay where the input images are known (recorded by the run, else `--data`, as
Grad-CAM's); captions name the sample, the class attributed and the model's probability for it. Its
deletion / insertion curves are one more picture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hookrun.analysis.gradcam import (  # noqa: F401 (plot's public names)
    _index,
    as_pictures,
    caption,
    class_names,
    gradcam,
    gradcam_pairs,
    is_map,
    predictions,
    recorded_images,
    targets,
)
from hookrun.analysis.report.figure_specs import weights_note
from hookrun.analysis.run_reader import CaptureInfo, Run
from hookrun.cli import figures
from hookrun.errors import NotFoundError
from hookrun.runner.kinds.attribution.reader import attribution_meta
from hookrun.runner.kinds.attribution.report import class_name, curve_area, random_curve


def run_label(run: Run) -> str:
    """The run as titles name it: its folder and file, and `random weights` where its model had them
    (figure_specs.random_weights: a picture of a random network says so)."""
    note = weights_note(run.config)
    return f"{run.path.parent.name}/{run.path.name}" + (f" · {note}" if note else "")


def _source(run: Run) -> str:
    return str(run.path.resolve())


def gradcam_figure(run: Run, act: CaptureInfo, grad: CaptureInfo, out: Path, samples: int = 4,
                   dataset: object | None = None) -> Path:
    n = min(samples, act.shape[0])
    cams = gradcam(run.file[act.path][:n].astype(np.float64), run.file[grad.path][:n].astype(np.float64))
    indices = _index(run, act)[:n]
    images = recorded_images(run, indices)
    if images is None and dataset is not None:
        images = np.stack([_item_input(dataset, int(i)) for i in indices])
    pictures = as_pictures(images) if images is not None else None
    if pictures is not None:
        h, w = pictures[0].shape[:2]
        cams = F.interpolate(torch.from_numpy(cams)[:, None], size=(h, w), mode="bilinear", align_corners=False)[:, 0].numpy()
    pred, target = predictions(run, indices), targets(run, indices)
    names = class_names(run)
    captions = [caption(i, pred[k] if pred is not None else None, target[k] if target is not None else None, names)
                for k, i in enumerate(indices)]
    head = f"{run_label(run)} · Grad-CAM at {act.module or '(model)'} (hooks {act.hook}, {grad.hook}/{grad.role})"
    if pictures is None:
        head += "\n(no input images: record the model's input, or pass --data)"
    fig = figures.gradcam_grid(cams, captions, head, pictures)
    return figures.save(fig, out / f"gradcam_{act.module or 'model'}.png", source=_source(run))


def _item_input(dataset: object, i: int) -> np.ndarray:
    item = dataset[i]  # type: ignore[index]
    x = item[0] if isinstance(item, tuple | list) else item
    x = x.detach().float().numpy()
    if x.ndim != 3 or x.shape[0] not in (1, 3):
        raise NotFoundError(f"--data: item {i} is a {tuple(x.shape)} tensor, not an image (channels 1 or 3, H, W)")
    return x


def attribution_figures(run: Run, out: Path, samples: int = 4, dataset: object | None = None) -> list[Path]:
    meta = attribution_meta(run.attrs)  # (an object-store run: from its manifest, nothing fetched)
    if meta is None:
        return []
    a = run.attribution()
    n = min(samples, a.shape[0])
    maps = a.values[:n].astype(np.float64)
    maps = maps.sum(1) if maps.ndim == 4 else maps.sum(-1)[:, None, :] if maps.ndim == 3 else maps.reshape(n, 1, -1)
    indices = a["sample"].values[:n]
    images = recorded_images(run, indices) if a.ndim == 4 else None  # the run's own (a hook on the input)
    if images is None and dataset is not None:
        images = np.stack([_item_input(dataset, int(i)) for i in indices])
    pictures = as_pictures(images) if images is not None else None
    if pictures is not None and maps.shape[-2:] != pictures[0].shape[:2]:
        maps = F.interpolate(torch.from_numpy(maps)[:, None], size=pictures[0].shape[:2], mode="bilinear",
                             align_corners=False)[:, 0].numpy()
    captions = attribution_captions(meta, a, indices)
    where = "the input" if meta["at"] == "input" else meta["at"]
    title = f"{meta['method']} attribution to {where}, summed over channels\n{run_label(run)}"
    if pictures is None:
        title += " (no input images: record the input, or --data, to draw the maps over them)"
    written = [figures.save(_grid(maps, captions, title, pictures), out / f"attribution_{meta['method']}.png",
                            source=str(run.path.resolve()))]
    curves = [w for w in ("deletion", "insertion") if f"{w}_area" in a.coords]
    if curves:
        written.append(figures.save(_curves(run, a, curves, meta["method"]), out / f"attribution_curves_{meta['method']}.png",
                                    source=str(run.path.resolve())))
    return written


def attribution_captions(meta: dict, a: Any, indices: Any) -> list[str]:
    """Each drawn sample's caption: its index, its target (the data set's class name where the run
    wrote them) and the target's probability."""
    return [f"#{i} · target {class_name(meta, a['target'][k])} · p {float(a['prob'][k]):.2f}" for k, i in enumerate(indices)]


def _grid(maps: np.ndarray, captions: list[str], title: str, pictures: list[np.ndarray] | None):
    def draw(ax, k: int):
        m = max(float(np.abs(maps[k]).max()), 1e-12)  # centred on zero: -m .. m
        if pictures is not None:
            ax.imshow(pictures[k].mean(-1), cmap="gray")
        ax.set_title(captions[k], fontsize=9)
        return ax.imshow(maps[k] / m, cmap=figures.diverging_cmap(), vmin=-1, vmax=1, alpha=0.6 if pictures is not None else 1.0,
                         aspect="auto" if maps[k].shape[0] == 1 else "equal")

    return figures.image_row(len(maps), draw, title, "attribution / max |attr.| (per sample)")


def _curves(run: Run, a: Any, names: list[str], method: str):
    """The curves `names` of the run whose attribution (with its areas) is `a`."""
    plt = figures.pyplot()
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.6), squeeze=False, layout="constrained")
    for ax, name in zip(axes[0], names, strict=True):
        c = run.attribution(name)
        x, rows = c["fraction"].values, c.values.astype(np.float64)
        colour = "#b2182b" if name == "deletion" else "#2166ac"
        for row in rows:
            ax.plot(x, row, color="#999999", alpha=0.3, linewidth=0.8)
        ax.fill_between(x, np.quantile(rows, 0.25, axis=0), np.quantile(rows, 0.75, axis=0), color=colour, alpha=0.2,
                        linewidth=0, label="middle half of the samples")
        ax.plot(x, rows.mean(0), color=colour, linewidth=2, label=f"mean (area {float(a[f'{name}_area'].mean()):.3f})")
        random = random_curve(run, name)
        if random is not None:
            ax.plot(x, random.mean(0), color="#333333", linewidth=1.6, linestyle="--",
                    label=f"random order (area {curve_area(random):.3f})")
        ax.set_xlabel(f"fraction of pixels {'removed' if name == 'deletion' else 'put back'}, most important first")
        ax.set_ylabel("probability of the target")
        ax.set_ylim(0, 1)
        ax.set_title(f"{name} ({len(c)} samples)")
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"{method}: a good map's deletion falls fast, its insertion rises fast\n{run_label(run)}")
    return fig
