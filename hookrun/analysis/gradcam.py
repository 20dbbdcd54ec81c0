"""Grad-CAM of a run that recorded a layer's maps and their gradient, from the file alone: read by
`plot` (`pictures`: MapRow specs, registered in analysis/drawings.py) and `report` (a section of overlays).

    pairs = gradcam_pairs(run)                 # (activation, gradient) captures of one module
    cams = gradcam(act_rows, grad_rows)        # (n, H, W) in [0, 1]

The map of a sample is relu(sum_c mean_hw(grad)_c * A_c) (Selvaraju et al.), scaled to [0, 1].
The input images are the run's own (a recorded 4-D input with 1 or 3 channels); each sample's
predicted class comes from a recorded logits capture and its target from /samples/target.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hookrun.analysis.images import MIN_MAX, as_pictures, fit_maps, guessed, map_rows  # noqa: F401 (the pictures' helpers, named here too)
from hookrun.text_labels import visible

CaptureInfo = Any
Run = Any


def is_map(info: CaptureInfo) -> bool:
    """A 4-D capture of maps, one (C, H, W) row per sample: not tokens nor heads (docs/format.md "Dim names")."""
    return len(info.shape) == 4 and info.rows == "samples" and not set(info.dims) & {"head", "token", "query", "key"}


def gradcam_pairs(run: Run) -> list[tuple[CaptureInfo, CaptureInfo]]:
    """(activation, gradient) captures of the same module and call: forward output with the
    tensor hook's grad, or with the backward hook's grad_output."""
    pairs = []
    for act in run.captures:
        if act.type != "forward" or act.role != "output" or not is_map(act) or not act.shape[0]:  # (0 rows: no map)
            continue
        for grad in run.captures:
            same = grad.module == act.module and grad.call == act.call and grad.shape == act.shape
            if same and ((grad.type == "tensor" and grad.role == "grad") or (grad.type == "backward" and grad.role == "grad_output")):
                if np.array_equal(_index(run, act), _index(run, grad)):
                    pairs.append((act, grad))
                    break
    return pairs


def gradcam(act: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """Grad-CAM (Selvaraju et al.) of (n, C, H, W) maps: relu(sum_c mean_hw(grad)_c * A_c), per sample, scaled to [0, 1] by
    its largest finite cell; a NaN or inf cell (an fp16 overflow) stays NaN or inf: drawn grey, no value."""
    weights = grad.mean(axis=(2, 3), keepdims=True)
    cam = np.maximum((weights * act).sum(axis=1), 0)  # (np.maximum keeps a NaN)
    flat = cam.reshape(len(cam), -1)
    top = np.where(np.isfinite(flat), flat, 0).max(axis=1, initial=0).reshape(-1, 1, 1)
    return cam / np.where(top > 0, top, 1)


def _index(run: Run, info: CaptureInfo) -> np.ndarray:
    return run.index(info.hook, info.module, info.role, call=info.call)


def _rows_of(run: Run, info: CaptureInfo, indices: np.ndarray) -> np.ndarray | None:
    """The capture's rows for these sample indices, or None if it lacks one of them."""
    where = {int(i): r for r, i in enumerate(_index(run, info))}
    if not all(int(i) in where for i in indices):
        return None
    ds = run.file[info.path]
    return np.stack([ds[where[int(i)]] for i in indices])


def _image_captures(run: Run) -> list[CaptureInfo]:
    found = [c for c in run.captures if c.role == "input" and len(c.shape) == 4 and c.shape[1] in (1, 3) and c.rows == "samples"]
    return sorted(found, key=lambda c: (c.module != "", -c.shape[2] * c.shape[3]))


def imaged(run: Run, indices: np.ndarray) -> int:
    """How many of `indices`, from the first, have a recorded input image (a `limit` records fewer)."""
    best = 0
    for info in _image_captures(run):
        where = {int(i) for i in _index(run, info)}
        best = max(best, next((k for k, i in enumerate(indices) if int(i) not in where), len(indices)))
    return best


def recorded_images(run: Run, indices: np.ndarray) -> np.ndarray | None:
    """Input images the run recorded itself: a 4-D input capture with 1 or 3 channels, the
    model's own input ('') first, then the largest."""
    for info in _image_captures(run):
        rows = _rows_of(run, info, indices)
        if rows is not None:
            return rows
    return None


def image_norm(run: Run, indices: np.ndarray) -> dict | None:
    """The data set's Normalize (the root attribute `input_normalize`) where the images recorded_images
    reads are the model's own input, which it normalised; None where as_pictures must min-max scale."""
    import json

    text = run.attrs.get("input_normalize")
    first = next((c for c in _image_captures(run) if _rows_of(run, c, indices[:1]) is not None), None)
    return json.loads(text) if isinstance(text, str) and first is not None and first.module == "" else None


def class_names(run: Run) -> list[str] | None:
    """The data set's class names where the run wrote them (the root attribute `class_names`, or an
    attribution run's own), else None: captions then give class numbers."""
    import json

    attrs = run.attrs
    for text in (attrs.get("class_names"), (json.loads(attrs["attribution"]) if attrs.get("attribution") else {}).get("class_names")):
        names = json.loads(text) if isinstance(text, str) else text
        if isinstance(names, list) and names:
            return [str(n) for n in names]
    return None


NO_PREDICTION = "n/a"  # predictions' entry for a sample whose logits are not all finite


def caption(i: int, pred: Any, target: Any, names: list[str] | None, cam: np.ndarray | None = None) -> str:
    """A sample's caption: `#i · pred NAME · target NAME` (class numbers where the names are not known;
    `pred n/a` where its logits are not finite), and how many cells of its map have no value."""
    # (not at the top: the report package imports this module)
    from hookrun.analysis.report.colour_scales import no_value_note

    # (a class name's carriage return or ESC as its escape: drawn raw it hid the rest of the caption)
    name = lambda c: str(c) if isinstance(c, str) else visible(names[int(c)]) if names is not None and 0 <= int(c) < len(names) else str(c)  # noqa: E731
    return " · ".join([f"#{i}", *([f"pred {name(pred)}"] if pred is not None else []),
                       *([f"target {name(target)}"] if target is not None else [])]) + (no_value_note(cam) if cam is not None else "")


def predictions(run: Run, indices: np.ndarray) -> np.ndarray | None:
    """Each sample's predicted class from a recorded logits capture: the model's output (''),
    else a hook named 'logits', else the only 2-D per-sample output. A sample whose logits are not
    all finite has no prediction (NO_PREDICTION: the argmax of a NaN row is made up)."""
    outputs = [c for c in run.captures if c.role == "output" and len(c.shape) == 2 and c.rows == "samples"]
    ranked = [c for c in outputs if c.module == ""] or [c for c in outputs if c.hook == "logits"] or (outputs if len(outputs) == 1 else [])
    for info in ranked:
        rows = _rows_of(run, info, indices)
        if rows is not None:
            pred = rows.argmax(axis=1).astype(object)
            pred[~np.isfinite(rows).all(axis=1)] = NO_PREDICTION
            return pred
    return None


def targets(run: Run, indices: np.ndarray) -> np.ndarray | None:
    if run.targets is None:
        return None
    where = {int(i): r for r, i in enumerate(run.samples)}
    return np.array([run.targets[where[int(i)]] for i in indices])


SAMPLES = 4  # maps a Grad-CAM picture of `plot` shows


def pictures(run: Run, samples: int = SAMPLES) -> list[tuple[str, Any]]:
    """plot's pictures (file stem, MapRow spec): each pair's maps over the run's own images (plot's
    --data fills them in where the run recorded none), captioned with the prediction and target."""
    from hookrun.analysis.report.figure_specs import MapRow, run_label

    out = []
    for act, grad in gradcam_pairs(run):
        n = min(samples, act.shape[0])
        cams = gradcam(map_rows(run, act, n), map_rows(run, grad, n))
        indices = _index(run, act)[:n]
        images, fewer = recorded_images(run, indices), ""
        if images is None and (k := imaged(run, indices)):  # the input recorded for the first k (its limit): those
            fewer, n, indices, cams = f" · the first {k}: the input image was recorded for those", k, indices[:k], cams[:k]
            images = recorded_images(run, indices)
        norm = image_norm(run, indices) if images is not None else None
        shown = as_pictures(images, norm) if images is not None else None
        fewer += f" · {MIN_MAX}" if images is not None and guessed(images, norm) else ""
        pred, target = predictions(run, indices), targets(run, indices)
        names = class_names(run)
        captions = [caption(i, pred[k] if pred is not None else None, target[k] if target is not None else None, names, cams[k])
                    for k, i in enumerate(indices)]  # (cells with no value counted at the maps' own size)
        if shown is not None:
            cams = fit_maps(cams, shown[0].shape[:2])
        head = f"{run_label(run)} · Grad-CAM at {act.module or '(model)'} (hooks {act.hook}, {grad.hook}/{grad.role}){fewer}"
        out.append((f"gradcam_{act.module or 'model'}",
                    MapRow(cams, captions, head, "Grad-CAM (scaled to 0-1 per sample)", indices, shown,
                           no_pictures="\n(no input images: record the model's input, or pass --data)")))
    return out
