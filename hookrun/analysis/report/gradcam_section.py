"""The report's Grad-CAM section: where a run holds a layer's maps and their gradient for the same
samples (experiment=gradcam, experiment=shapes_gradcam), each sample's Grad-CAM map over its
input image, as `plot` draws it (analysis/gradcam.py computes both).

    [*gradcam(run, budget)]     # empty where the run has no (maps, gradient) pair

The map is on the sequential scale (0 to 1 per sample: Grad-CAM is a ReLU, it has no sign),
translucent over the image the run recorded; without recorded images, the map alone.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

from hookrun.analysis.gradcam import (
    MIN_MAX,
    _index,
    as_pictures,
    caption,
    class_names,
    gradcam_pairs,
    guessed,
    image_norm,
    imaged,
    map_rows,
    predictions,
    recorded_images,
    targets,
)
from hookrun.analysis.gradcam import gradcam as cam_of
from hookrun.analysis.report.figure_specs import NO_VALUE, SEQUENTIAL
from hookrun.analysis.report.run_sections import section
from hookrun.errors import module_label

SAMPLES = 8  # overlays per pair


def overlay_png(cam: np.ndarray, picture: np.ndarray | None, size: int = 128) -> str:
    """A (H, W) map in [0, 1] over an (h, w, 3) picture in [0, 1] (or alone) as a PNG data URI; a NaN
    or inf cell grey (NO_VALUE, opaque), as `plot` draws it."""
    from matplotlib import colormaps
    from matplotlib.colors import to_rgb
    from PIL import Image

    side = picture.shape[:2] if picture is not None else cam.shape
    k = max(1, size // max(side))
    shape = (side[1] * k, side[0] * k)
    finite = np.isfinite(cam)
    heat = Image.fromarray((np.clip(np.where(finite, cam, 0), 0, 1) * 255).astype(np.uint8)).resize(shape, Image.BILINEAR)
    rgb = colormaps[SEQUENTIAL](np.asarray(heat, dtype=np.float64) / 255)[..., :3]
    if picture is not None:
        base = np.asarray(Image.fromarray((picture * 255).astype(np.uint8)).resize(shape, Image.NEAREST), dtype=np.float64) / 255
        rgb = 0.5 * base + 0.5 * rgb
    bad = np.asarray(Image.fromarray((~finite).astype(np.uint8) * 255).resize(shape, Image.NEAREST)) > 0
    rgb[bad] = to_rgb(NO_VALUE)
    buf = io.BytesIO()
    Image.fromarray((rgb * 255).astype(np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def gradcam(run: Any, budget: Any = None) -> list[dict]:
    items = []
    for act, grad in gradcam_pairs(run):
        n = min(SAMPLES, act.shape[0])
        cams = cam_of(map_rows(run, act, n), map_rows(run, grad, n))
        indices = _index(run, act)[:n]
        images, fewer = recorded_images(run, indices), ""
        if images is None and (k := imaged(run, indices)):  # the input recorded for the first k (its limit): those
            fewer, n, indices, cams = f"; the input image was recorded for the first {k}: those", k, indices[:k], cams[:k]
            images = recorded_images(run, indices)
        norm = image_norm(run, indices) if images is not None else None
        pictures = as_pictures(images, norm) if images is not None else [None] * n
        fewer += f"; {MIN_MAX}" if images is not None and guessed(images, norm) else ""
        pred, target = predictions(run, indices), targets(run, indices)
        names = class_names(run)
        shown = [{"src": overlay_png(cams[k], pictures[k]),
                  "caption": caption(i, pred[k] if pred is not None else None, target[k] if target is not None else None, names,
                                     cams[k])}
                 for k, i in enumerate(indices)]
        where = module_label(act.module)
        items.append({"type": "images", "title": f"Grad-CAM at {where} (hooks {act.hook}, {grad.hook}/{grad.role}): first {n} samples{fewer}"
                                                 + ("" if images is not None else "; no input images recorded: the maps alone"),
                      "images": shown})
    note = ("relu(Σ_c mean_hw(grad)_c · A_c) per sample (Selvaraju et al.), scaled to 0-1 per sample; "
            "sequential colour scale (viridis), translucent over the recorded input image")
    return [section("gradcam", "Grad-CAM", items, note)] if items else []
