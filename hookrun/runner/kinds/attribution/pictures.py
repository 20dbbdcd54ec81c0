"""plot's pictures of an attribution run (its reader's `figures`): the maps and the curves as figure
specs, which `python -m hookrun.plot` draws with matplotlib.

    figures(open_run("outputs/attr/captures.h5"))   # [("attribution_saliency", MapRow), ("attribution_curves_saliency", Bands)]

Each map is the attribution summed over channels (a token model's: over the embedding's features,
one cell per token position along the axis, captions naming the target token's text where the
run's tokens are data=text's bytes, else its id), at the picture's size where the run recorded the
input (report.py's shown_maps, which the report's overlays use too), on one diverging colour scale
centred on zero per sample (red: for the target, blue: against), over the input in grey where it is
known (recorded by the run, else plot's `--data`); captions name the sample, the class attributed and
the model's probability for it. The deletion / insertion curves are one more picture: every
sample's curve, the middle half as a band, the mean with its area and the random order's mean.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from hookrun.analysis.report.figure_specs import Band, Bands, MapRow, run_label
from hookrun.analysis.report.token_text import byte_label, is_byte_text
from hookrun.runner.kinds.attribution.report import class_name, curve_area, random_curve, shown_maps

SAMPLES = 2  # maps in plot's picture where it is not told (plot's default --samples)
COLOURS = {"deletion": "#b2182b", "insertion": "#2166ac"}


def figures(run: Any, samples: int = SAMPLES) -> list[tuple[str, Any]]:
    """(file stem, spec) of the first `samples` maps and, where the run measured them, the curves; [] for
    another kind."""
    if run.attrs.get("attribution") is None:  # another kind (an object-store run: its manifest, nothing fetched)
        return []
    meta = json.loads(run.attrs["attribution"])
    a = run.attribution()
    indices, maps, pictures = shown_maps(run, samples)
    where = "the input" if meta["at"] == "input" else meta["at"]
    fewer = f" · the first {len(indices)}: the input image was recorded for those" if len(indices) < min(samples, a.shape[0]) else ""
    tokens = a.dims[1] == "position"  # a token model's: (sample, position, feature), no image to draw under
    feats = "the embedding's" if meta["at"] == "input" else f"{meta['at']}'s"
    summed = f"summed over {feats} features at each token position" if tokens else "summed over channels"
    title = f"{meta['method']} attribution to {where}, {summed}{fewer}\n{run_label(run)}"
    out: list[tuple[str, Any]] = [(f"attribution_{meta['method']}", MapRow(
        maps, captions(meta, a, indices, run if tokens else None), title, "attribution / max |attr.| (per sample)", indices,
        pictures, signed=True, xlabel="token position" if tokens else "",
        no_pictures="" if tokens else " (no input images: record the input, or --data, to draw the maps over them)"))]
    names = [w for w in ("deletion", "insertion") if f"{w}_area" in a.coords]
    if names:
        out.append((f"attribution_curves_{meta['method']}", curves(run, a, names, meta["method"])))
    return out


def captions(meta: dict, a: Any, indices: Any, token_run: Any = None) -> list[str]:
    """Each drawn sample's caption: its index, its target (the data set's class name where the run
    wrote them; of a token model, `token_run`'s: the token's text where its tokens are data=text's
    bytes, else its id) and the target's probability."""
    def target(c: Any) -> str:
        if token_run is None or isinstance(c, str):
            return class_name(meta, c)
        return f"'{byte_label(int(c))}'" if is_byte_text(token_run.config) else f"token {int(c)}"

    return [f"#{i} · target {target(a['target'].values[k])} · p {float(a['prob'][k]):.2f}" for k, i in enumerate(indices)]


def curves(run: Any, a: Any, names: list[str], method: str) -> Bands:
    """The curves `names` of the run whose attribution (with its areas) is `a`."""
    panels = []
    for name in names:
        c = run.attribution(name)
        random = random_curve(run, name)
        panels.append(Band(
            c["fraction"].values, c.values.astype(np.float64), COLOURS[name],
            f"mean (area {float(a[f'{name}_area'].mean()):.3f})", f"{name} ({len(c)} samples)",
            f"fraction of pixels {'removed' if name == 'deletion' else 'put back'}, most important first",
            "probability of the target", random.mean(0) if random is not None else None,
            f"random order (area {curve_area(random):.3f})" if random is not None else "", (0.0, 1.0)))
    return Bands(panels, f"{method}: a good map's deletion falls fast, its insertion rises fast\n{run_label(run)}")
