"""`python -m hookrun.plot PATH --out figures/`: pictures of a run or a sweep (PNG, matplotlib).

    python -m hookrun.plot outputs/2026-11-21/10-00-00/captures.h5 --out figures/
    python -m hookrun.plot outputs/multirun/2026-11-21/10-00-00 --out figures/ --stat mean

For a run: a feature-map grid for each 4-D capture, a histogram for each capture, and Grad-CAM
overlays where the run holds a layer's output and its gradient (type tensor, or backward's
grad_output) for the same samples; the input images come from rebuilding the run's dataset
from its config. For a sweep: each capture's statistic against the swept value.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hookrun.analysis.run import CaptureInfo, Run, block_stats, open_run
from hookrun.analysis.sweep import Sweep, is_sweep, open_sweep
from hookrun.errors import HookrunError

HIST_VALUES = 2_000_000  # at most this many values go into one histogram


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    _plt().close(fig)
    return path


def _name(info: CaptureInfo) -> str:
    return info.label.replace("/", "__").replace("(model)", "model").replace("@", "_call")


def feature_maps(run: Run, info: CaptureInfo, out: Path, samples: int = 2, channels: int = 16) -> Path:
    plt = _plt()
    ds = run.file[info.path]
    rows = ds[: min(samples, ds.shape[0])]
    channels = min(channels, rows.shape[1])
    cols = min(8, channels)
    per_sample = (channels + cols - 1) // cols
    fig, axes = plt.subplots(per_sample * len(rows), cols, figsize=(1.6 * cols, 1.6 * per_sample * len(rows)), squeeze=False)
    index = run.index(info.hook, info.module, info.role, call=info.call)
    for s, sample in enumerate(rows):
        for c in range(per_sample * cols):
            ax = axes[s * per_sample + c // cols][c % cols]
            ax.axis("off")
            if c < channels:
                ax.imshow(sample[c], cmap="viridis")
                ax.set_title(f"#{index[s]} ch {c}", fontsize=7)
    fig.suptitle(f"{info.label}  {tuple(ds.shape[1:])}", fontsize=9)
    return _save(fig, out / f"fmap_{_name(info)}.png")


def histogram(run: Run, info: CaptureInfo, out: Path) -> Path:
    plt = _plt()
    ds = run.file[info.path]
    per_row = max(1, int(np.prod(ds.shape[1:], dtype=np.int64)))
    rows = max(1, min(ds.shape[0], HIST_VALUES // per_row))
    values = np.asarray(ds[:rows], dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    stats = block_stats(ds)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.hist(values, bins=100, color="#3b6ea5")
    ax.set_yscale("log")
    ax.set_title(f"{info.label}", fontsize=9)
    ax.set_xlabel(f"mean {stats['mean']:.3g}  std {stats['std']:.3g}  zeros {stats['zeros']:.1%}"
                  + (f"  (first {rows} of {ds.shape[0]} rows)" if rows < ds.shape[0] else ""), fontsize=8)
    return _save(fig, out / f"hist_{_name(info)}.png")


def gradcam_pairs(run: Run) -> list[tuple[CaptureInfo, CaptureInfo]]:
    """(activation, gradient) captures of the same module and call: forward output with the
    tensor hook's grad, or with the backward hook's grad_output."""
    pairs = []
    for act in run.captures:
        if act.type != "forward" or act.role != "output" or len(act.shape) != 4 or act.rows != "samples":
            continue
        for grad in run.captures:
            same = grad.module == act.module and grad.call == act.call and grad.shape == act.shape
            if same and ((grad.type == "tensor" and grad.role == "grad") or (grad.type == "backward" and grad.role == "grad_output")):
                if np.array_equal(run.index(act.hook, act.module, act.role, call=act.call),
                                  run.index(grad.hook, grad.module, grad.role, call=grad.call)):
                    pairs.append((act, grad))
                    break
    return pairs


def gradcam(act: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """Grad-CAM (Selvaraju et al.): relu(sum_c mean_hw(grad)_c * A_c), per sample, scaled to [0, 1]."""
    weights = grad.mean(axis=(2, 3), keepdims=True)
    cam = np.maximum((weights * act).sum(axis=1), 0)
    top = cam.reshape(len(cam), -1).max(axis=1).reshape(-1, 1, 1)
    return cam / np.where(top > 0, top, 1)


def input_images(run: Run, indices: np.ndarray) -> list[np.ndarray] | None:
    """The run's input images (H, W, 3 in [0, 1]) rebuilt from its config, or None."""
    try:
        from hookrun.config.build import build_dataset

        dataset = build_dataset(run.config["data"]["dataset"])
        images = []
        for i in indices:
            item = dataset[int(i)]
            x = (item[0] if isinstance(item, tuple | list) else item).detach().float().numpy()
            if x.ndim != 3 or x.shape[0] not in (1, 3):
                return None
            x = np.moveaxis(x, 0, -1)
            x = (x - x.min()) / max(float(x.max() - x.min()), 1e-8)
            images.append(x if x.shape[-1] == 3 else np.repeat(x, 3, axis=-1))
        return images
    except Exception:  # the dataset may not be importable here: draw the maps alone
        return None


def gradcam_figure(run: Run, act: CaptureInfo, grad: CaptureInfo, out: Path, samples: int = 4) -> Path:
    import torch
    import torch.nn.functional as F

    plt = _plt()
    n = min(samples, act.shape[0])
    cams = gradcam(run.file[act.path][:n].astype(np.float64), run.file[grad.path][:n].astype(np.float64))
    indices = run.index(act.hook, act.module, act.role, call=act.call)[:n]
    images = input_images(run, indices)
    fig, axes = plt.subplots(1, n, figsize=(2.6 * n, 2.8), squeeze=False)
    for k in range(n):
        ax = axes[0][k]
        ax.axis("off")
        cam = cams[k]
        if images is not None:
            h, w = images[k].shape[:2]
            cam = F.interpolate(torch.from_numpy(cam)[None, None], size=(h, w), mode="bilinear", align_corners=False)[0, 0].numpy()
            ax.imshow(images[k])
            ax.imshow(cam, cmap="jet", alpha=0.45)
        else:
            ax.imshow(cam, cmap="jet")
        ax.set_title(f"sample #{indices[k]}", fontsize=8)
    fig.suptitle(f"Grad-CAM at {act.module or '(model)'} ({grad.hook}/{grad.role})", fontsize=9)
    return _save(fig, out / f"gradcam_{act.module or 'model'}.png")


def plot_run(run: Run, out: Path, samples: int = 2, channels: int = 16) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for info in run.captures:
        if len(info.shape) == 4 and info.rows == "samples":
            written.append(feature_maps(run, info, out, samples, channels))
        written.append(histogram(run, info, out))
    for act, grad in gradcam_pairs(run):
        written.append(gradcam_figure(run, act, grad, out))
    return written


def plot_sweep(sweep: Sweep, out: Path, stat: str = "mean", x: str | None = None) -> list[Path]:
    plt = _plt()
    out.mkdir(parents=True, exist_ok=True)
    table = sweep.table(stats=(stat,))
    x = x or (sweep.swept[0] if sweep.swept else "job")
    xs = table.column(x)
    try:
        order = np.argsort(np.asarray(xs, dtype=float))
    except (TypeError, ValueError):
        order = np.arange(len(xs))
    columns = [c for c in table.columns if c.endswith(f":{stat}")]
    fig, ax = plt.subplots(figsize=(6, 4))
    for col in columns:
        ys = table.column(col)
        ax.plot([xs[i] for i in order], [ys[i] for i in order], marker="o", label=col.rsplit(":", 1)[0])
    ax.set_xlabel(x)
    ax.set_ylabel(stat)
    ax.set_title(f"{sweep.folder.name}: {stat} per capture", fontsize=9)
    if columns:
        ax.legend(fontsize=7)
    return [_save(fig, out / f"sweep_{stat}.png")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hookrun.plot", description=__doc__.splitlines()[0])
    p.add_argument("path", type=Path, help="a capture file, a run folder, or a multirun folder")
    p.add_argument("--out", type=Path, default=Path("figures"), help="folder for the PNGs (default: figures/)")
    p.add_argument("--samples", type=int, default=2, help="samples per feature-map grid")
    p.add_argument("--channels", type=int, default=16, help="channels per sample in a feature-map grid")
    p.add_argument("--stat", default="mean", choices=["mean", "std", "min", "max", "zeros"], help="sweep: the statistic to plot")
    p.add_argument("--x", help="sweep: the override on the x axis (default: the first swept key)")
    a = p.parse_args(argv)
    try:
        if is_sweep(a.path):
            written = plot_sweep(open_sweep(a.path), a.out, a.stat, a.x)
        else:
            with open_run(a.path) as run:
                written = plot_run(run, a.out, a.samples, a.channels)
    except HookrunError as exc:
        print(f"hookrun.plot: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"hookrun.plot: error: {exc}; install the plot extra: pip install 'hookrun[plot]'", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
