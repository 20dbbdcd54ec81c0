"""`python -m hookrun.plot PATH [--out DIR]`: pictures of a run or a sweep (PNG, matplotlib), by
default in figures/ beside the run's file (or in the sweep folder).

    python -m hookrun.plot outputs/2026-11-21/10-00-00/captures.h5 --out figures/
    python -m hookrun.plot outputs/multirun/2026-11-21/10-00-00 --out figures/ --stat std

For a run: a feature-map grid for each 4-D capture of maps, a grid of heads for each attention pattern
(a capture whose dims are `sample, head, query, key`: query and key positions labelled with the
tokens' text where the file holds /samples/input_ids of byte tokens, else with their positions,
padding left out), a histogram for each capture, and Grad-CAM
overlays where the run holds a layer's output and its gradient (type tensor, or backward's
grad_output) for the same samples, with each sample's predicted class (from a recorded logits
capture) and target. The overlay's input images come from the file itself when the run recorded
them (a 4-D input capture with 1 or 3 channels); otherwise from a dataset the user names with
`--data data=... [key=value ...]`. Reading a file never builds anything the file names. For a
sweep: each capture's statistic against the swept value. The files written are listed at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hookrun.analysis.opening import open_run
from hookrun.analysis.report.tokens import byte_label, token_text  # noqa: F401 (byte_label: plot's public name)
from hookrun.analysis.run import CaptureInfo, Run, block_stats
from hookrun.analysis.sweep import Sweep, is_sweep, open_sweep
from hookrun.cli import figures
from hookrun.cli.app import compose_config
from hookrun.config.build import build_dataset
from hookrun.config.schema import load
from hookrun.errors import HookrunError, NotFoundError
from hookrun.store.schema import PATTERN

HIST_VALUES = 2_000_000  # at most this many values go into one histogram


def _name(info: CaptureInfo) -> str:
    return info.label.replace("/", "__").replace("(model)", "model").replace("@", "_call")


def run_label(run: Run) -> str:
    return f"{run.path.parent.name}/{run.path.name}"


def title(run: Run, info: CaptureInfo) -> str:
    call = f" (call {info.call})" if info.call else ""
    return f"{run_label(run)} · hook {info.hook} · {info.module or '(model)'} · {info.role}{call}"


def feature_maps(run: Run, info: CaptureInfo, out: Path, samples: int = 2, channels: int = 16) -> Path:
    ds = run.file[info.path]
    rows = np.asarray(ds[: min(samples, ds.shape[0])], dtype=np.float32)[:, :channels]
    index = run.index(info.hook, info.module, info.role, call=info.call)
    fig = figures.feature_grid(rows, [f"sample #{i}" for i in index[: len(rows)]], title(run, info),
                               label=f"{info.role} value")
    return figures.save(fig, out / f"fmap_{_name(info)}.png", source=_source(run))


def is_pattern(info: CaptureInfo) -> bool:
    """An attention pattern (or its scores): one (head, query, key) row per sample."""
    return info.rows == "samples" and tuple(info.dims[1:]) == PATTERN


def is_map(info: CaptureInfo) -> bool:
    """A 4-D capture of maps, one (C, H, W) row per sample: not tokens nor heads (docs/format.md "Dim names")."""
    return len(info.shape) == 4 and info.rows == "samples" and not set(info.dims) & {"head", "token", "query", "key"}


def attention_maps(run: Run, info: CaptureInfo, out: Path, samples: int = 2, heads: int = 16) -> Path:
    """Each head's (query, key) map for the first samples, cropped to each sample's real tokens."""
    ds = run.file[info.path]
    rows = np.asarray(ds[: min(samples, ds.shape[0])], dtype=np.float32)[:, :heads]
    index = _index(run, info)[: len(rows)]
    maps, ticks = [], []
    for m, i in zip(rows, index, strict=True):
        keep, text = token_text(run, int(i), m.shape[-1])
        if keep is not None:  # the real tokens' keys; the queries among them (the last `queries` positions)
            queries = keep[keep >= m.shape[-1] - m.shape[-2]] - (m.shape[-1] - m.shape[-2])
            m = m[:, queries][:, :, keep]
        maps.append(m)
        ticks.append(text)
    head = title(run, info) + (" (first heads)" if ds.shape[1] > heads else "")
    fig = figures.attention_grid(maps, [f"#{i}" for i in index], head, ticks, label=f"{info.role} value")
    return figures.save(fig, out / f"attn_{_name(info)}.png", source=_source(run))


def histogram(run: Run, info: CaptureInfo, out: Path) -> Path:
    ds = run.file[info.path]
    per_row = max(1, int(np.prod(ds.shape[1:], dtype=np.int64)))
    rows = max(1, min(ds.shape[0], HIST_VALUES // per_row))
    values = np.asarray(ds[:rows], dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    note = f"first {rows} of {ds.shape[0]} rows" if rows < ds.shape[0] else ""
    fig = figures.histogram(values, block_stats(ds), title(run, info), f"{info.role} value", note)
    return figures.save(fig, out / f"hist_{_name(info)}.png", source=_source(run))


def gradcam_pairs(run: Run) -> list[tuple[CaptureInfo, CaptureInfo]]:
    """(activation, gradient) captures of the same module and call: forward output with the
    tensor hook's grad, or with the backward hook's grad_output."""
    pairs = []
    for act in run.captures:
        if act.type != "forward" or act.role != "output" or not is_map(act):
            continue
        for grad in run.captures:
            same = grad.module == act.module and grad.call == act.call and grad.shape == act.shape
            if same and ((grad.type == "tensor" and grad.role == "grad") or (grad.type == "backward" and grad.role == "grad_output")):
                if np.array_equal(_index(run, act), _index(run, grad)):
                    pairs.append((act, grad))
                    break
    return pairs


def gradcam(act: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """Grad-CAM (Selvaraju et al.): relu(sum_c mean_hw(grad)_c * A_c), per sample, scaled to [0, 1]."""
    weights = grad.mean(axis=(2, 3), keepdims=True)
    cam = np.maximum((weights * act).sum(axis=1), 0)
    top = cam.reshape(len(cam), -1).max(axis=1).reshape(-1, 1, 1)
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


def recorded_images(run: Run, indices: np.ndarray) -> np.ndarray | None:
    """Input images the run recorded itself: a 4-D input capture with 1 or 3 channels, the
    model's own input ('') first, then the largest."""
    found = [c for c in run.captures if c.role == "input" and len(c.shape) == 4 and c.shape[1] in (1, 3) and c.rows == "samples"]
    found.sort(key=lambda c: (c.module != "", -c.shape[2] * c.shape[3]))
    for info in found:
        rows = _rows_of(run, info, indices)
        if rows is not None:
            return rows
    return None


def predictions(run: Run, indices: np.ndarray) -> np.ndarray | None:
    """Each sample's predicted class from a recorded logits capture: the model's output (''),
    else a hook named 'logits', else the only 2-D per-sample output."""
    outputs = [c for c in run.captures if c.role == "output" and len(c.shape) == 2 and c.rows == "samples"]
    ranked = [c for c in outputs if c.module == ""] or [c for c in outputs if c.hook == "logits"] or (outputs if len(outputs) == 1 else [])
    for info in ranked:
        rows = _rows_of(run, info, indices)
        if rows is not None:
            return rows.argmax(axis=1)
    return None


def targets(run: Run, indices: np.ndarray) -> np.ndarray | None:
    if run.targets is None:
        return None
    where = {int(i): r for r, i in enumerate(run.samples)}
    return np.array([run.targets[where[int(i)]] for i in indices])


def as_pictures(batch: np.ndarray) -> list[np.ndarray]:
    """(n, C, H, W) with C 1 or 3 -> H x W x 3 images in [0, 1], each scaled on its own."""
    out = []
    for x in np.asarray(batch, dtype=np.float64):
        x = np.moveaxis(x, 0, -1)
        x = (x - x.min()) / max(float(x.max() - x.min()), 1e-8)
        out.append(x if x.shape[-1] == 3 else np.repeat(x, 3, axis=-1))
    return out


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


def plot_run(run: Run, out: Path, samples: int = 2, channels: int = 16, dataset: object | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for info in run.captures:
        if is_pattern(info):
            written.append(attention_maps(run, info, out, samples, channels))
        elif is_map(info):
            written.append(feature_maps(run, info, out, samples, channels))
        written.append(histogram(run, info, out))
    for act, grad in gradcam_pairs(run):
        written.append(gradcam_figure(run, act, grad, out, dataset=dataset))
    return written


def plot_sweep(sweep: Sweep, out: Path, stat: str = "mean", x: str | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    table = sweep.table(stats=(stat,))
    x = x or (sweep.swept[0] if sweep.swept else "job")
    if x not in table.columns:
        raise NotFoundError(f"--x {x}: the sweep has no override {x!r}; it has: {', '.join(table.columns[1:-1]) or 'none'}")
    series = {c.rsplit(":", 1)[0]: table.column(c) for c in table.columns if c.endswith(f":{stat}")}
    fig = figures.sweep_lines(table.column(x), series, x, stat, f"{sweep.folder.name}: {stat} of each capture against {x}")
    return [figures.save(fig, out / f"sweep_{stat}.png", source=str(sweep.folder.resolve()))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hookrun.plot", description=__doc__.splitlines()[0])
    p.add_argument("path", type=Path, help="a capture file, a run folder, or a multirun folder")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for the PNGs (default: figures/ beside the run's file, or in the sweep folder); "
                        "a figure of another run there is never replaced")
    p.add_argument("--samples", type=int, default=2, help="samples per feature-map grid")
    p.add_argument("--channels", type=int, default=16, help="channels per sample in a feature-map grid (heads in an attention grid)")
    p.add_argument("--stat", default="mean", choices=["mean", "std", "min", "max", "zeros"], help="sweep: the statistic to plot")
    p.add_argument("--x", help="sweep: the override on the x axis (default: the first swept key)")
    p.add_argument("--data", nargs="+", metavar="OVERRIDE",
                   help="Grad-CAM: the dataset whose images to draw under the maps, as config overrides "
                        "(data=image_folder data.root=PATH); used only when the file holds no input images")
    a = p.parse_args(argv)
    if a.out is None:  # beside what it shows: one run's figures never meet another's
        a.out = (a.path if a.path.is_dir() else a.path.parent) / "figures"
    try:
        if is_sweep(a.path):
            written = plot_sweep(open_sweep(a.path), a.out, a.stat, a.x)
        else:
            dataset = user_dataset(a.data) if a.data else None
            with open_run(a.path) as run:
                written = plot_run(run, a.out, a.samples, a.channels, dataset)
    except HookrunError as exc:
        print(f"hookrun: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"hookrun: error: {exc}; install the plot extra: pip install 'hookrun[plot]'", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} figure(s) to {a.out}:")
    for path in written:
        print(f"  {path}")
    return 0


def _source(run: Run) -> str:
    return str(run.path.resolve())


def user_dataset(overrides: list[str]) -> object:
    """The dataset the user named on the command line (never one named in the file)."""
    return build_dataset(load(compose_config(overrides)).data.dataset)


if __name__ == "__main__":
    sys.exit(main())
