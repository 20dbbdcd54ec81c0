"""The report's section of SAE latents and other top examples, read through the reader's API
(the logit lens' pictures are analysis/report/lens_figures.py).

    latents(run, budget)   # [] where the file has no top examples

From `run.top_example_modules` / `run.top_examples(module, feature)`, with each latent's
activations from a recorded capture of its module and its decoder norm from the SAE's folder.

A convolutional layer's latents are pictures (ChannelImages, below): each top example's input
image (the run's own recorded input) with the channel's (H, W) map over it, resized (bilinear), on
the sequential scale from 0 to the channel's largest value over the examples shown, at half opacity
(gradcam_section.overlay_png draws both): `ChannelImages.of(run, capture).src(sample=17, channel=3)`
is a PNG data URI (None where the run kept no row of that sample).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hookrun.analysis.gradcam import _index, as_pictures, image_norm, is_map
from hookrun.analysis.images import channels_last
from hookrun.analysis.report.figure_specs import (
    histogram_of,
)
from hookrun.analysis.report.gradcam_section import overlay_png
from hookrun.analysis.report.run_sections import Budget, figure, row_blocks, sampled_rows, section
from hookrun.text_labels import WHITESPACE, natural_key, visible


def latents(run: Any, budget: Budget) -> list[dict]:
    """Per module with top examples: a searchable list of latents, each with its top examples
    (tokens, the activating one highlighted), its activation histogram (from a recorded capture
    of that module, where the file has one: of the real tokens, as the top examples, never the
    padding) and its decoder norm (where the file holds it)."""
    modules = dict(getattr(run, "top_example_modules", None) or {})
    items = []
    for module, n in sorted(modules.items(), key=lambda kv: natural_key(kv[0])):  # (by depth: h.2 before h.10)
        capture = _latent_capture(run, module)
        values, note = (None, "")
        if capture is not None:
            values, note = sampled_rows(run.file[capture.path], budget.values * 8)
            real = real_tokens(run, capture, budget.values * 8) if values.ndim == 3 else None
            values = np.moveaxis(values, 1, -1) if values.ndim == 4 and not channels_last(capture) else values  # a map's features: its channels
            values = values[real] if real is not None else values.reshape(-1, values.shape[-1])  # (padding left out)
        norms = _decoder_norms(run, module)
        shown = min(n, budget.features)
        lookup = TokenActivations(run, capture) if capture is not None and capture.rows == "tokens" else None
        pictures = ChannelImages.of(run, capture)  # a conv layer's channels: their maps over the recorded images
        rows = []
        for f in range(shown):
            examples = run.top_examples(module, f)
            entry: dict[str, Any] = {"feature": f, "examples": [_example(e, lookup, f) for e in examples],
                                     "max": float(max((e["value"] for e in examples), default=0.0))}
            if pictures is not None:
                for ex in entry["examples"]:
                    ex["src"] = pictures.src(ex["sample"], f, entry["max"])
            hist = histogram_of(values[:, f], f"{module} latent {f}: activations", "activation", note) if values is not None and f < values.shape[1] else None
            if hist is not None:
                entry["hist"] = figure(hist)["figure"]
            if norms is not None and f < len(norms):
                entry["decoder_norm"] = float(norms[f])
            rows.append(entry)
        items.append({"type": "latents", "module": module, "features": rows,
                      "title": f"{module}: {n} latents" + (f" (the first {shown} listed)" if shown < n else "")})
    return [section("latents", "Latents", items)] if items else []


def _shown(token: str) -> str:
    """A context token as the page draws it: a newline as its sign (an example is one line), each other
    character that does not print as its escape (\\x0d, \\x1b): drawn raw, a carriage return or an
    ESC was an empty span of no width, the token the latent fires on not seen."""
    return visible(str(token).replace("\n", WHITESPACE["\n"]))


def _example(e: dict, lookup: TokenActivations | None, feature: int) -> dict:
    out = {"value": float(e["value"]), "sample": int(e["sample"]), "position": e.get("position"),
           "context": [_shown(t) for t in e["context"]] if e.get("context") is not None else None, "at": e.get("at")}
    if lookup is not None and out["context"] is not None and out["at"] is not None and out["position"] is not None:
        real = lookup.real_position(out["sample"], int(out["position"]))  # the padded row's index -> token_position
        if real is None:
            out["acts"] = [None] * len(out["context"])
        else:  # the context's tokens are real tokens in a row: consecutive real positions
            start = real - int(out["at"])
            out["acts"] = lookup.values(out["sample"], range(start, start + len(out["context"])), feature)
    return out


class TokenActivations:
    """The activations of a token-row capture at (sample, position), read a few rows at a time:
    each context token of a top example gets its own value (None where the run kept no row).
    A top example's position is its index in the padded row; token_position counts real tokens
    only, so `real_position` converts with the row's /samples/attention_mask."""

    def __init__(self, run: Any, info: Any) -> None:
        f = run.file
        self.ds = f[info.path]
        n = self.ds.shape[0]
        sample, position = f["samples/token_sample"][:n].astype(np.int64), f["samples/token_position"][:n].astype(np.int64)
        self.width = int(position.max()) + 1 if n else 1
        keys = sample * self.width + position
        self.order = np.argsort(keys, kind="stable")
        self.keys = keys[self.order]
        s = f["samples"]
        ids = s["input_ids"] if "input_ids" in s and s["input_ids"].ndim == 2 else None
        self.row_width = ids.shape[1] if ids is not None else None
        self.mask = s["attention_mask"] if ids is not None and "attention_mask" in s and s["attention_mask"].shape == ids.shape else None
        self.rows = {int(v): r for r, v in enumerate(s["index"][:])}

    def real_position(self, sample: int, position: int) -> int | None:
        """The token_position of the padded row's `position`: the real tokens before it (None where
        unknown: no attention_mask stored and the sample has fewer token rows than its row's width)."""
        r = self.rows.get(int(sample))
        if r is None:
            return None
        if self.mask is not None:
            real = np.asarray(self.mask[r], dtype=bool)
            return int(real[:position].sum()) if 0 <= position < len(real) and real[position] else None
        lo, hi = np.searchsorted(self.keys, [sample * self.width, (sample + 1) * self.width])
        return position if self.row_width is not None and hi - lo == self.row_width else None  # no padding: the same

    def values(self, sample: int, positions: range, feature: int) -> list[float | None]:
        want = np.array([sample * self.width + p if 0 <= p < self.width else -1 for p in positions], dtype=np.int64)
        at = np.clip(np.searchsorted(self.keys, want), 0, max(len(self.keys) - 1, 0))
        found = (want >= 0) & (self.keys[at] == want) if len(self.keys) else np.zeros(len(want), bool)
        rows = np.where(found, self.order[at], -1)
        if not found.any():
            return [None] * len(want)
        lo, hi = int(rows[found].min()), int(rows[found].max())
        block = np.asarray(self.ds[lo : hi + 1, feature], dtype=np.float64)  # one read: the context's rows are together
        return [float(block[r - lo]) if r >= 0 else None for r in rows.tolist()]


def real_tokens(run: Any, capture: Any, values: int) -> np.ndarray | None:
    """(rows read, positions): True at the real tokens (/samples/attention_mask 1, the tokens top
    examples are taken from) of the rows sampled_rows reads of a (sample, position, feature) capture;
    None where the file holds no mask of its samples' width (every position counts)."""
    f = run.file
    mask = f["samples/attention_mask"] if "samples" in f and "attention_mask" in f["samples"] else None
    if capture.rows != "samples" or mask is None or mask.ndim != 2 or mask.shape[1] != capture.shape[1]:
        return None
    rows = np.concatenate([np.arange(r.start, r.stop) for r in row_blocks(tuple(capture.shape), values)])
    index = np.asarray(run.index(capture.hook, capture.module, capture.role, call=capture.call), dtype=np.int64)[rows]
    table = {int(v): r for r, v in enumerate(f["samples/index"][: mask.shape[0]])}  # a sample's row of /samples
    at = np.array([table.get(int(i), -1) for i in index], dtype=np.int64)  # (shuffled or offset data: ids are not rows)
    if (at < 0).any():
        return None
    return np.asarray(mask[:], dtype=np.int64)[at] == 1


def _latent_capture(run: Any, module: str) -> Any:
    """The recorded tensor the top examples were taken from: the same hook's output (a forward_pre
    hook's input) first, then any other capture of the module."""
    top = next((c for c in run.captures if c.module == module and c.role == "top.values"), None)
    role = "input" if top is not None and top.type == "forward_pre" else "output"
    found = [c for c in run.captures if c.module == module and not c.role.startswith(("top.", "lens.")) and len(c.shape) >= 2]
    found.sort(key=lambda c: (top is None or c.hook != top.hook, c.role != role))
    return found[0] if found else None


def _decoder_norms(run: Any, module: str) -> np.ndarray | None:
    """Each latent's decoder row norm |W_dec[f]|, where the run spliced an SAE at `module` (its
    latents are the module `MODULE.sae.latents`) and the SAE folder its config names is still
    there (SAELens' sae_weights.safetensors or sparsify's sae.safetensors: tensors only, nothing
    is built); None elsewhere."""
    from pathlib import Path

    for spec in (run.config.get("hooks") or {}).values():
        at = spec.get("at")
        for action in spec.get("actions") or []:
            if not isinstance(action, dict) or action.get("op") != "splice" or not isinstance(at, str):
                continue
            if module not in (at, f"{at}.sae.latents", f"{at}.sae"):
                continue
            folder = Path(str(action.get("path", "")))
            for name in ("sae_weights.safetensors", "sae.safetensors"):
                if (folder / name).is_file():
                    from safetensors.numpy import load_file

                    w = load_file(str(folder / name)).get("W_dec")
                    if w is not None:
                        return np.linalg.norm(np.asarray(w, dtype=np.float64), axis=1)
    return None


class ChannelImages:
    def __init__(self, run: Any, maps: Any, images: Any) -> None:
        self.run, self.maps, self.images = run, maps, images
        self.map_rows = {int(i): r for r, i in enumerate(_index(run, maps))}
        self.image_rows = {int(i): r for r, i in enumerate(_index(run, images))}
        self.norm = image_norm(run, _index(run, images)[:1])  # (the data set's Normalize, undone: the raw image)

    @classmethod
    def of(cls, run: Any, capture: Any) -> ChannelImages | None:
        if capture is None or not is_map(capture):
            return None
        found = [c for c in run.captures if c.role == "input" and len(c.shape) == 4 and c.shape[1] in (1, 3) and c.rows == "samples"]
        found.sort(key=lambda c: (c.module != "", -c.shape[2] * c.shape[3]))
        return cls(run, capture, found[0]) if found else None

    def channel(self, sample: int, channel: int) -> np.ndarray | None:
        r = self.map_rows.get(int(sample))
        if r is None:
            return None
        return np.asarray(self.run.file[self.maps.path][r, ..., channel] if channels_last(self.maps)
                          else self.run.file[self.maps.path][r, channel], dtype=np.float64)

    def picture(self, sample: int) -> np.ndarray | None:
        """The sample's input image (H x W x 3 in [0, 1]), its normalisation undone where the run wrote it."""
        r = self.image_rows.get(int(sample))
        return None if r is None else as_pictures(np.asarray(self.run.file[self.images.path][r : r + 1]), self.norm)[0]

    def src(self, sample: int, channel: int, top: float) -> str | None:
        m, picture = self.channel(sample, channel), self.picture(sample)
        if m is None or picture is None:
            return None
        if m.shape != picture.shape[:2]:
            from PIL import Image

            m = np.asarray(Image.fromarray(m.astype(np.float32), mode="F").resize(picture.shape[1::-1], Image.BILINEAR), dtype=np.float64)
        return overlay_png(np.clip(m, 0, None) / (top if top > 0 else 1.0), picture)
