"""Attribution pictures of `python -m hookrun.plot`: an attribution run's maps over its input images,
and its deletion / insertion curves.

    attribution_figures(run, Path("figures"), samples=4, dataset=ds)   # [] for a run of another kind

Each map is the attribution summed over channels (a layer's map resized to the image, bilinear),
drawn with one diverging colour scale centred on zero per sample (red: for the target, blue:
against), as a translucent overlay where the input images are known (recorded by the run, else `--data`, as Grad-CAM's).
Captions name the sample, the class attributed and the model's probability for it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hookrun.analysis.run_reader import Run
from hookrun.cli import figures
from hookrun.cli.gradcam import _item_input, as_pictures, recorded_images, run_label
from hookrun.runner.kinds.attribution.reader import attribution_meta


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
    captions = [f"#{i} · target {int(a['target'][k])} · p {float(a['prob'][k]):.2f}" for k, i in enumerate(indices)]
    where = "the input" if meta["at"] == "input" else meta["at"]
    title = f"{meta['method']} attribution to {where}, summed over channels\n{run_label(run)}"
    if pictures is None:
        title += " (no input images: record the input, or --data, to draw the maps over them)"
    written = [figures.save(_grid(maps, captions, title, pictures), out / f"attribution_{meta['method']}.png",
                            source=str(run.path.resolve()))]
    curves = [w for w in ("deletion", "insertion") if f"{w}_area" in a.coords]
    if curves:
        written.append(figures.save(_curves(run, curves, meta["method"]), out / f"attribution_curves_{meta['method']}.png",
                                    source=str(run.path.resolve())))
    return written


def _grid(maps: np.ndarray, captions: list[str], title: str, pictures: list[np.ndarray] | None):
    def draw(ax, k: int):
        m = max(float(np.abs(maps[k]).max()), 1e-12)  # centred on zero: -m .. m
        if pictures is not None:
            ax.imshow(pictures[k].mean(-1), cmap="gray")
        ax.set_title(captions[k], fontsize=9)
        return ax.imshow(maps[k] / m, cmap=figures.diverging_cmap(), vmin=-1, vmax=1, alpha=0.6 if pictures is not None else 1.0,
                         aspect="auto" if maps[k].shape[0] == 1 else "equal")

    return figures.image_row(len(maps), draw, title, "attribution / max |attr.| (per sample)")


def _curves(run: Run, names: list[str], method: str):
    plt = figures.pyplot()
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.6), squeeze=False, layout="constrained")
    for ax, name in zip(axes[0], names, strict=True):
        c = run.attribution(name)
        x = c["fraction"].values
        for row in c.values:
            ax.plot(x, row, color="#999999", alpha=0.3, linewidth=0.8)
        ax.plot(x, c.values.mean(0), color="#b2182b" if name == "deletion" else "#2166ac", linewidth=2,
                label=f"mean (area {float(run.attribution()[f'{name}_area'].mean()):.3f})")
        ax.set_xlabel(f"fraction of pixels {'removed' if name == 'deletion' else 'put back'}, most important first")
        ax.set_ylabel("probability of the target")
        ax.set_ylim(0, 1)
        ax.set_title(f"{name} ({len(c)} samples)")
        ax.legend(loc="best")
    fig.suptitle(f"{method}: a good map's deletion falls fast, its insertion rises fast\n{run_label(run)}")
    return fig
