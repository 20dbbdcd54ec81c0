"""Grad-CAM pictures of `python -m hookrun.plot`: a layer's maps and their gradient, over the input images
(the maps, images and classes are read by analysis/gradcam.py, which the report shares).

    pairs = gradcam_pairs(run)                        # (activation, gradient) captures of one module
    gradcam_figure(run, *pairs[0], out=Path("figures"))

The map of a sample is relu(sum_c mean_hw(grad)_c * A_c) (Selvaraju et al.), scaled to [0, 1].
The input images come from the file itself where the run recorded them, else from a dataset the
user names on the command line; each sample is captioned with its predicted class (a recorded
logits capture) and target.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hookrun.analysis.gradcam import (  # noqa: F401 (plot's public names)
    _index,
    as_pictures,
    gradcam,
    gradcam_pairs,
    is_map,
    predictions,
    recorded_images,
    targets,
)
from hookrun.analysis.run_reader import CaptureInfo, Run
from hookrun.cli import figures
from hookrun.errors import NotFoundError


def run_label(run: Run) -> str:
    return f"{run.path.parent.name}/{run.path.name}"


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
    captions = []
    for k, i in enumerate(indices):
        parts = [f"#{i}"] + ([f"pred {pred[k]}"] if pred is not None else []) + ([f"target {target[k]}"] if target is not None else [])
        captions.append(" · ".join(parts))
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
