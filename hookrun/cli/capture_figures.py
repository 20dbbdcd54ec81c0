"""plot's pictures of one capture: a grid of feature maps, a grid of attention heads, a histogram;
their titles and file names (every capture's pictures name the file they came from, figures.save).

    path = feature_maps(run, info, Path("figures"), samples=2, channels=16)   # figures/fmap_<label>.png
    path = histogram(run, info, Path("figures"))                              # None where it says nothing
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from hookrun.analysis.images import map_rows
from hookrun.analysis.report.figure_specs import (
    run_label,
    skip_reason,
    value_label,
    without_mask_fill,
)
from hookrun.analysis.report.run_sections import LeftOut
from hookrun.analysis.report.token_text import token_text
from hookrun.analysis.run_reader import CaptureInfo, Run, block_stats
from hookrun.cli import figures
from hookrun.errors import MODEL_LABEL
from hookrun.store import PATTERN

HIST_VALUES = 2_000_000  # at most this many values go into one histogram


def source_of(run: Run) -> str:
    return str(run.path.resolve())


def _index(run: Run, info: CaptureInfo) -> np.ndarray:
    return run.index(info.hook, info.module, info.role, call=info.call)


def picture_name(info: CaptureInfo) -> str:
    """A capture's part of its pictures' file names: its label, '/' as '__', made safe for any file
    system (_file_name's characters; a name past 200 ends in its hash, under NAME_MAX with its prefix)."""
    name = file_name(info.label.replace(MODEL_LABEL, "model").replace("@", "_call"), limit=None)
    return name if len(name) <= 200 else f"{name[:191]}.{hashlib.blake2b(name.encode(), digest_size=4).hexdigest()}"


def title(run: Run, info: CaptureInfo) -> str:
    call = f" (call {info.call})" if info.call else ""
    return f"{run_label(run)} · hook {info.hook} · {info.module or '(model)'} · {info.role}{call}"


def feature_maps(run: Run, info: CaptureInfo, out: Path, samples: int = 2, channels: int = 16,
                 taken: set[Path] | None = None) -> Path:
    rows = map_rows(run, info, samples, np.float32)[:, :channels]  # (channels first, however stored)
    index = run.index(info.hook, info.module, info.role, call=info.call)
    fig = figures.feature_grid(rows, [f"sample #{i}" for i in index[: len(rows)]], title(run, info),
                               label=value_label(info.role))
    return figures.save(fig, out / f"fmap_{picture_name(info)}.png", source=source_of(run), taken=taken)


def is_pattern(info: CaptureInfo) -> bool:
    """An attention pattern (or its scores): one (head, query, key) row per sample."""
    return info.rows == "samples" and tuple(info.dims[1:]) == PATTERN


def attention_maps(run: Run, info: CaptureInfo, out: Path, samples: int = 2, heads: int = 16,
                   taken: set[Path] | None = None) -> Path:
    """Each head's (query, key) map for the first samples, cropped to each sample's real tokens."""
    ds = run.file[info.path]
    rows = without_mask_fill(ds[: min(samples, ds.shape[0])][:, :heads], (ds.attrs.get("torch_dtype"), ds.dtype))  # (a mask's -3.4e38: grey)
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
    return figures.save(fig, out / f"attn_{picture_name(info)}.png", source=source_of(run), taken=taken)


def histogram(run: Run, info: CaptureInfo, out: Path, left: LeftOut | None = None,
              taken: set[Path] | None = None) -> Path | None:
    ds = run.file[info.path]
    why = skip_reason(info, ds)
    per_row = max(1, int(np.prod(ds.shape[1:], dtype=np.int64)))
    rows = max(1, min(ds.shape[0], HIST_VALUES // per_row))
    values = np.asarray(ds[:rows], dtype=np.float64).ravel() if why is None else np.zeros(0)
    values = values[np.isfinite(values)]
    if why is None and not values.size:
        why = f"no finite value in its first {rows} rows"
    if why is not None:
        (left or LeftOut()).add(f"the histogram of {info.label}", why)
        return None
    note = f"first {rows} of {ds.shape[0]} rows" if rows < ds.shape[0] else ""
    fig = figures.histogram(values, block_stats(ds), title(run, info), value_label(info.role), note)
    return figures.save(fig, out / f"hist_{picture_name(info)}.png", source=source_of(run), taken=taken)


def file_name(text: str, limit: int | None = 80) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text.replace("/", "__"))[:limit]
