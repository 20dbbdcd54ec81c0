"""The report's sections of an attribution run: its maps over the input images and its deletion /
insertion curves with their areas (registered as the kind's `sections`, reader.py).

    sections(run)            # [] for a run of another kind
    shown_maps(run, 8)       # (sample indices, (n, H, W) maps summed over channels, pictures or None)

Each map is the attribution summed over channels (a layer's map resized to the image, bilinear; a
sequence's: over features, one row), on the diverging scale of analysis/report/colour_scales.py
centred on zero per sample (red: for the target, blue: against), at least SIZE pixels wide, over the
image the run recorded (in grey; experiment=attribution_shapes records one), opaque where the map is
strongest; without one, the map alone; a colour bar after. Captions name the target and the
prediction (a recorded logits capture) by the data set's class names where the run wrote them.

A sweep of attribution runs compared: sweep_report.py.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import numpy as np

from hookrun.analysis.gradcam import fit_maps, image_norm, imaged, predictions, recorded_images
from hookrun.analysis.images import MIN_MAX, as_pictures, guessed
from hookrun.analysis.report.colour_scales import (
    DIVERGING,
    NEGATIVE,
    POSITIVE,
    diverging_range,
    no_value_note,
    to_rgb,
)
from hookrun.analysis.report.plotly_figures import escape, title_layout
from hookrun.analysis.report.run_sections import section, table_item
from hookrun.text_labels import visible

SAMPLES = 8  # overlays shown
LINES = 32  # samples drawn behind the mean curve
ALPHA = 0.35  # the map's opacity over the image where it is 0 (1 at the sample's largest |value|)
SIZE = 256  # an overlay's side in pixels, at least
SCALE = "attribution / max |attribution| of the sample (red: for the target, blue: against)"
CURVE_COLOURS = {"deletion": POSITIVE, "insertion": NEGATIVE}


def summed(values: np.ndarray) -> np.ndarray:
    """(n, H, W) maps: the attribution summed over channels (features: a sequence is one row)."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 4:
        return v.sum(1)
    if v.ndim == 3:
        return v.sum(-1)[:, None, :]
    return v.reshape(len(v), 1, -1)


def shown_maps(run: Any, n: int = SAMPLES) -> tuple[np.ndarray, np.ndarray, list[np.ndarray] | None]:
    """The first `n` samples: their indices, their maps (summed over channels, at the picture's size
    where there is one) and the pictures the run recorded (None where it recorded none); where the
    run recorded the input for fewer (a `limit`), the first of those only."""
    a = run.attribution()
    n = min(n, a.shape[0])
    maps = summed(a.values[:n])
    indices = a["sample"].values[:n]
    images = recorded_images(run, indices) if a.ndim == 4 else None
    if images is None and a.ndim == 4 and (k := imaged(run, indices)):  # the input recorded for the first k (its limit)
        indices, maps, images = indices[:k], maps[:k], recorded_images(run, indices[:k])
    pictures = as_pictures(images, image_norm(run, indices)) if images is not None else None
    if pictures is not None:
        maps = fit_maps(maps, pictures[0].shape[:2])
    return indices, maps, pictures


def overlay_png(m: np.ndarray, lo: float, hi: float, picture: np.ndarray | None, size: int = SIZE) -> str:
    """A map on the diverging scale (lo..hi) over an (H, W, 3) picture in [0, 1] drawn in grey (or
    alone): each pixel's colour at an opacity from ALPHA (no attribution) to 1 (the largest |value|),
    so the strongest evidence shows in its own colour; scaled up by a whole factor to at least
    `size` pixels (nearest neighbour), as a PNG data URI."""
    from matplotlib.colors import LinearSegmentedColormap
    from PIL import Image

    cmap = LinearSegmentedColormap.from_list("hookrun_diverging", list(DIVERGING))
    rgb = to_rgb(m, lo, hi, cmap)  # (a NaN or inf pixel: NO_VALUE, opaque, never a colour of the scale)
    if picture is not None:
        grey = np.repeat(np.asarray(picture, dtype=np.float64).mean(-1, keepdims=True), 3, axis=-1)
        half = max((hi - lo) / 2, 1e-300)
        near = np.clip(np.abs(np.where(np.isfinite(m), m, hi) - (lo + hi) / 2) / half, 0, 1)
        alpha = ALPHA + (1 - ALPHA) * near[..., None]
        rgb = (1 - alpha) * grey + alpha * rgb
    k = max(1, -(-size // max(m.shape)))
    img = Image.fromarray(np.round(rgb * 255).astype(np.uint8)).resize((m.shape[1] * k, m.shape[0] * k), Image.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def colorbar_png(label: str, width: float = 3.6) -> str:
    """The overlays' colour bar (the diverging scale from -1 to 1, its label below) as a PNG data URI."""
    from matplotlib.colorbar import ColorbarBase
    from matplotlib.colors import LinearSegmentedColormap, Normalize
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 0.95), dpi=100, layout="constrained")
    bar = ColorbarBase(fig.add_subplot(), cmap=LinearSegmentedColormap.from_list("hookrun_diverging", list(DIVERGING)),
                       norm=Normalize(-1, 1), orientation="horizontal")
    bar.set_ticks([-1, -0.5, 0, 0.5, 1])
    bar.set_label(label, fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def class_name(meta: dict, c: Any) -> str:
    """Class `c` by the data set's class name where the run wrote them (`class_names`), else its number."""
    names = meta.get("class_names") or []  # (a str `c`: gradcam.NO_PREDICTION, the logits not finite)
    return c if isinstance(c, str) else visible(str(names[int(c)])) if 0 <= int(c) < len(names) else str(int(c))  # (a \r or ESC as its escape)


def overlays(run: Any, meta: dict) -> dict:
    a = run.attribution()
    indices, maps, pictures = shown_maps(run)
    pred = predictions(run, indices)
    if pred is None and meta.get("target") == "predicted":
        pred = a["target"].values[: len(indices)]
    shown = []
    for k, i in enumerate(indices):
        lo, hi = diverging_range(maps[k])
        words = [f"#{int(i)}", f"target {class_name(meta, a['target'].values[k])}"]
        if pred is not None:
            words.append(f"pred {class_name(meta, pred[k])}")
        words.append(f"p {float(a['prob'].values[k]):.2f}")
        words.append(f"max |attr.| {hi:.3g}" + no_value_note(maps[k]))
        shown.append({"src": overlay_png(maps[k], lo, hi, pictures[k] if pictures is not None else None),
                      "caption": " · ".join(words), "sample": int(i), "scale": [lo, hi]})
    shown.append({"src": colorbar_png(SCALE), "caption": "colour bar: each map on this scale", "colorbar": True})
    where = "the input" if meta["at"] == "input" else meta["at"]
    fewer = len(indices) < min(SAMPLES, a.shape[0])  # (the input image recorded for these only: a `limit`)
    over = "channels" if a.ndim == 4 else f"the {a.shape[-1]} features at each token position"  # (pictures.py's words)
    title = (f"{meta['method']} attribution to {where}, summed over {over}: first {len(indices)} samples"
             + ("; the input image was recorded for those" if fewer else "")
             + (f"; {MIN_MAX}" if pictures is not None and guessed(recorded_images(run, indices), image_norm(run, indices)) else "")
             + ("" if pictures is not None or a.ndim != 4 else "; no input image recorded (a hook recording the model's input "
                                                "draws the maps over the images): the maps alone"))
    return {"type": "images", "title": title, "images": shown}


def curve_figure(fraction: np.ndarray, rows: np.ndarray, name: str, area: float, title: str,
                 random: np.ndarray | None = None) -> dict:
    """Every sample's curve (grey, at most LINES), the middle half of the samples (a band between
    the quartiles), their mean (coloured, its area in the legend) and, where the run measured it,
    the mean curve of a random pixel order (dashed): the reference a map must beat."""
    x = fraction.tolist()
    data = [{"type": "scatter", "mode": "lines", "x": x, "y": row.tolist(), "showlegend": False,
             "line": {"color": "#999999", "width": 0.8}, "opacity": 0.35, "hoverinfo": "skip"} for row in rows[:LINES]]
    low, high = np.quantile(rows, 0.25, axis=0), np.quantile(rows, 0.75, axis=0)
    colour = CURVE_COLOURS.get(name, "#333333")
    data.append({"type": "scatter", "mode": "lines", "x": x, "y": low.tolist(), "line": {"width": 0, "color": colour},
                 "showlegend": False, "hoverinfo": "skip"})
    data.append({"type": "scatter", "mode": "lines", "x": x, "y": high.tolist(), "fill": "tonexty", "opacity": 0.2,
                 "line": {"width": 0, "color": colour}, "name": "middle half of the samples (quartiles)",
                 "hoverinfo": "skip"})
    data.append({"type": "scatter", "mode": "lines+markers", "x": x, "y": rows.mean(0).tolist(),
                 "name": escape(f"mean (area {area:.4f})"), "line": {"color": colour, "width": 3},
                 "hovertemplate": "fraction %{x:.3f}<br>probability %{y:.4f}<extra>mean</extra>"})
    if random is not None:
        data.append({"type": "scatter", "mode": "lines", "x": x, "y": random.mean(0).tolist(),
                     "name": escape(f"random order, mean (area {float(curve_area(random)):.4f})"),
                     "line": {"color": "#333333", "width": 2, "dash": "dash"},
                     "hovertemplate": "fraction %{x:.3f}<br>probability %{y:.4f}<extra>random order</extra>"})
    return {"data": data, "layout": curve_layout(title, name)}


def curve_area(rows: np.ndarray) -> float:
    """The mean area under `rows` (trapezoids over [0, 1], as the run's own areas)."""
    steps = rows.shape[1] - 1
    return float((((rows[:, 1:] + rows[:, :-1]) / 2).sum(1) / steps).mean())


def random_curve(run: Any, name: str) -> np.ndarray | None:
    """The run's random-order curves of `name` (None where it was written before they were)."""
    from hookrun.errors import NotFoundError

    try:
        return run.attribution(f"{name}_random").values.astype(np.float64)
    except NotFoundError:  # an older run: no random-order curves
        return None


def curve_layout(title: str, name: str) -> dict:
    what = "removed" if name == "deletion" else "put back"
    head, top = title_layout(title)
    return {"title": head, "font": {"size": 11}, "height": 400,
            "margin": {"l": 60, "r": 20, "t": top, "b": 50}, "legend": {"orientation": "h", "x": 0, "y": -0.22},
            "xaxis": {"title": {"text": f"fraction of pixels {what}, most important first"}, "range": [-0.02, 1.02]},
            "yaxis": {"title": {"text": "probability of the target"}, "range": [-0.02, 1.04]}}


def curves(run: Any, meta: dict) -> list[dict]:
    a = run.attribution()
    names = [w for w in ("deletion", "insertion") if f"{w}_area" in a.coords]
    if not names:
        return []
    figs, rows = [], []
    for name in names:
        c = run.attribution(name)
        areas = a[f"{name}_area"].values.astype(np.float64)
        mean = float(np.mean(areas))
        title = f"{name}: {len(c)} samples, {c.shape[1] - 1} steps"
        random = random_curve(run, name)
        figs.append({"figure": curve_figure(c["fraction"].values, c.values.astype(np.float64), name, mean, title, random),
                     "caption": ""})
        rows.append({"curve": name, "mean area": mean, "random order": curve_area(random) if random is not None else None,
                     "min": float(areas.min()), "max": float(areas.max()),
                     "samples": int(len(areas)), "better": "lower" if name == "deletion" else "higher"})
    per = [{"sample": int(i), "target": class_name(meta, t), **{f"{w} area": float(a[f"{w}_area"].values[k]) for w in names}}
           for k, (i, t) in enumerate(zip(a["sample"].values[:SAMPLES], a["target"].values[:SAMPLES], strict=True))]
    return [{"type": "figures", "title": "deletion / insertion curves: the target's probability per step, each sample "
                                          "(grey), the middle half (band), their mean, and a random pixel order (dashed)",
             "figures": figs},
            table_item(["curve", "mean area", "random order", "min", "max", "samples", "better"], rows),
            table_item(["sample", "target", *[f"{w} area" for w in names]], per)]


def meta_of(run: Any) -> dict | None:
    text = run.attrs.get("attribution")
    return json.loads(text) if text is not None else None


def sections(run: Any) -> list[dict]:
    meta = meta_of(run)
    if meta is None:
        return []
    items = [overlays(run, meta), *curves(run, meta)]
    note = ("maps on the diverging colour scale centred on 0 per sample (red: for the target class, blue: against; its colour "
            f"bar after the maps), over the recorded input in grey, from {ALPHA:.0%} opacity where the map is 0 to opaque at the "
            "sample's largest |value|; areas by the trapezoid rule over [0, 1]: a good map's "
            "deletion falls fast (small area), its insertion rises fast (large area)")
    return [section("attribution", f"Attribution ({meta['method']})", items, note)]
