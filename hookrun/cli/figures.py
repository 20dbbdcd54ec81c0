"""The figures of `python -m hookrun.plot`: arrays in, matplotlib figures out, one look for all.

    fig = feature_grid(maps, rows=["#0", "#1"], title="run · hook blocks · layer1.0 · output")
    save(fig, Path("figures/fmap.png"))

Every figure has readable fonts, axis labels where there are axes, one colour scale with one
colour bar where colours carry values, and tick labels that cannot run together (few ticks,
scientific notation for small or large values), titles that fit (figure_titles.py) and count axes
on a log scale only where the counts span more than two decades. Nothing here reads a file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hookrun.analysis.report.figure_specs import (
    DIVERGING,
    NO_VALUE,
    SEQUENTIAL,
    Heatmap,
    Lines,
    beyond_range,
    category_key,
    diverging_range,
    finite_range,
    is_categorical,
    is_signed,
    log_counts,
    no_value_note,
    sample_scale,
)
from hookrun.cli.figure_ticks import tidy_ticks, upright_if_crowded, value_ticks
from hookrun.cli.figure_titles import fit_titles, literal_text, titles  # noqa: F401 (titles: the figures' public name)
from hookrun.store.whole_file import write_whole

STYLE = {"font.size": 11, "axes.titlesize": 11, "axes.labelsize": 11, "xtick.labelsize": 9, "ytick.labelsize": 9,
         "legend.fontsize": 9, "figure.titlesize": 12, "figure.dpi": 100}


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    return plt


RUN_OF: dict[str, str] = {}  # a file's run (plot_command.identity), as plot_run names it: each PNG's "Run"


def save(fig: Any, path: Path, source: str | None = None, taken: set[Path] | None = None) -> Path:
    """Write the PNG, with the run (or sweep) it shows in its metadata ("Source": the file; "Run":
    which run wrote that file, RUN_OF, so a replaced run's figures are told). A figure of
    another run already at `path` is never replaced: this one gets the run's short id in its name;
    nor one this command wrote (in `taken`: two captures whose names make one file name, the whole
    model's `(model)` and a submodule named `model`): the second is NAME.2.png."""
    if taken is not None:
        stem, n = path.stem, 1
        while path in taken:
            n += 1
            path = path.with_name(f"{stem}.{n}{path.suffix}")
        taken.add(path)
    if source is not None and path.exists() and _source_of(path) != source:
        path = path.with_name(f"{path.stem}.{hashlib.blake2b(source.encode(), digest_size=4).hexdigest()}{path.suffix}")
    literal_text(fig)  # ('$' in a name is a dollar, never maths: before the first draw)
    fit_titles(fig)
    run = RUN_OF.get(source or "")
    meta = {"Source": source, **({"Run": run} if run else {})} if source else None
    try:  # (whole or not at all: a plot killed mid-write leaves no cut-off PNG under the final name)
        write_whole(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100, metadata=meta))
    finally:
        pyplot().close(fig)
    return path


def _source_of(path: Path) -> str | None:
    """The run a PNG written by save() shows (None for any other PNG: it is left alone too)."""
    return metadata(path).get("Source")


def metadata(path: Path) -> dict:
    """A PNG's text metadata ({} for a file that is not a readable PNG)."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            return dict(im.info)
    except Exception:
        return {}


def diverging_cmap() -> Any:
    """The diverging scale both renderers share (analysis/report/figure_specs.py): positive red."""
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list("hookrun_diverging", list(DIVERGING))


def feature_grid(maps: np.ndarray, rows: Sequence[str], title: str, cols: int = 8, label: str = "value") -> Any:
    """maps: (samples, channels, H, W). One row block per sample, one shared colour scale."""
    plt = pyplot()
    samples, channels = maps.shape[:2]
    cols = min(cols, channels)
    per_sample = -(-channels // cols)
    signed = is_signed(maps)  # values of both signs: centred on 0; either way of the finite values only
    vmin, vmax = diverging_range(maps) if signed else finite_range(maps)
    cmap = diverging_cmap() if signed else SEQUENTIAL
    fig, axes = plt.subplots(per_sample * samples, cols, figsize=(1.5 * cols + 1.4, 1.5 * per_sample * samples + 0.9),
                             squeeze=False, layout="constrained")
    image = None
    for s in range(samples):
        for c in range(per_sample * cols):
            ax = axes[s * per_sample + c // cols][c % cols]
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= channels:
                ax.axis("off")
                continue
            ax.set_facecolor(NO_VALUE)  # (a NaN or inf cell is left transparent: grey, as in the report)
            image = ax.imshow(maps[s, c], cmap=cmap, vmin=vmin, vmax=vmax)
            ax.set_title(f"ch {c}", fontsize=9, pad=2)
            if c % cols == 0:
                ax.set_ylabel(rows[s], fontsize=10)
    bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.9, label=label)
    tidy_ticks(bar.ax.yaxis)
    fig.suptitle(title + no_value_note(maps))
    return fig


def attention_grid(maps: Sequence[np.ndarray], rows: Sequence[str], title: str,
                   ticks: Sequence[Sequence[str] | None], cols: int = 4, label: str = "attention") -> Any:
    """maps: one (heads, query, key) array per sample, each cropped to that sample's real tokens.
    A block of heads per sample (`cols` heads a row), each sample on one colour scale its heads share, with its colour
    bar (sample_scale: 0 to 1 where every value is a probability; scores of both signs diverging about 0, a masked cell
    grey), query down and key across, labelled with the tokens' text (`ticks`: one label per position, per sample)."""
    plt = pyplot()
    heads = max(m.shape[0] for m in maps)
    cols = min(cols, heads)
    per_sample = -(-heads // cols)
    values = np.concatenate([np.ravel(m) for m in maps]) if maps else np.zeros(0)
    fig, axes = plt.subplots(per_sample * len(maps), cols, figsize=(2.9 * cols + 1.4, 2.9 * per_sample * len(maps) + 0.9),
                             squeeze=False, layout="constrained")
    for s, m in enumerate(maps):
        (vmin, vmax), centre, bar_label = sample_scale(m, label)  # (the report's rule: a scale per sample, its heads sharing it)
        for h in range(per_sample * cols):
            ax = axes[s * per_sample + h // cols][h % cols]
            if h >= m.shape[0]:
                ax.axis("off")
                continue
            ax.set_facecolor(NO_VALUE)  # (a masked, NaN or inf cell is left transparent: grey)
            image = ax.imshow(m[h], cmap=SEQUENTIAL if centre is None else diverging_cmap(), vmin=vmin, vmax=vmax,
                              interpolation="nearest")
            ax.set_title(f"{rows[s]} · head {h}", fontsize=9, pad=2)
            _position_ticks(ax, m.shape[1], m.shape[2], ticks[s])
            ax.set_xlabel("key", fontsize=9)
            ax.set_ylabel("query", fontsize=9)
        bar = fig.colorbar(image, ax=axes[s * per_sample:(s + 1) * per_sample].ravel().tolist(), shrink=0.9, label=bar_label)
        tidy_ticks(bar.ax.yaxis)
    fig.suptitle(title + no_value_note(values).replace("NaN or inf", "masked, NaN or inf"))
    return fig


def _position_ticks(ax: Any, queries: int, keys: int, text: Sequence[str] | None, most: int = 24) -> None:
    """Each position's token text (every k-th where there are more than `most`), or its number.
    The query axis holds the last `queries` positions of the key axis (a pass over new tokens)."""
    for axis, n, offset in ((ax.xaxis, keys, 0), (ax.yaxis, queries, keys - queries)):
        step = max(1, -(-n // most))
        where = list(range(0, n, step))
        if text is not None and len(text) == keys:
            names = [text[offset + i] for i in where]
            axis.set_ticks(where, names, fontsize=7, fontfamily="monospace")
            if axis is ax.xaxis:
                axis.set_tick_params(rotation=90)
        else:
            axis.set_ticks(where[:: max(1, len(where) // 6)], [str(offset + i) for i in where[:: max(1, len(where) // 6)]],
                           fontsize=7)


def histogram(values: np.ndarray, stats: Mapping[str, float], title: str, xlabel: str, note: str = "") -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    values = np.asarray(values, dtype=np.float64).ravel()
    counts, bounds = np.histogram(values, bins=100)
    ax.hist(bounds[:-1], bins=bounds, weights=counts, color="#3b6ea5")  # the counts above, not counted twice
    log = log_counts(counts)  # a log axis only where the counts span more than two decades
    ax.set_yscale("log" if log else "linear")
    tidy_ticks(ax.xaxis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count (log scale)" if log else "count")
    ax.set_title(title)
    bad = int(stats.get("nonfinite", 0))  # (the statistics and the bars are of the finite values: how many are not)
    text = f"mean {stats['mean']:.3g}\nstd {stats['std']:.3g}\nzeros {stats['zeros']:.1%}" + "".join(f"\n{t}" for t in (
        f"{bad} NaN or inf ({bad / max(int(stats.get('values', bad)), 1):.1%}) left out" if bad else "", note) if t)
    ax.text(0.98, 0.97, text, transform=ax.transAxes, ha="right", va="top", fontsize=9,
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85, "edgecolor": "#999999"})
    return fig


def image_row(n: int, draw: Callable[[Any, int], Any], title: str, label: str) -> Any:
    """A row of n pictures without ticks: `draw(ax, k)` draws the k-th and returns the image its
    colour bar (labelled `label`) reads; the figure is titled `title` (sample_figures.py's map rows)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, n, figsize=(2.9 * n + 1.2, 3.6), squeeze=False, layout="constrained")
    heat = None
    for k in range(n):
        ax = axes[0][k]
        ax.set_xticks([])
        ax.set_yticks([])
        heat = draw(ax, k)
    fig.colorbar(heat, ax=axes.ravel().tolist(), shrink=0.85, label=label)
    fig.suptitle(title)
    return fig


def lines(spec: Lines) -> Any:
    """A Lines spec (analysis/report/figure_specs.py): the report draws the same spec with plotly."""
    fig = sweep_lines(spec.x, spec.series, spec.xlabel, spec.ylabel, spec.title, getattr(spec, "in_order", False),
                      getattr(spec, "references", ()))
    if getattr(spec, "log_x", False):  # (a 0 among the values: linear from 0 to 1, log beyond)
        fig.axes[0].set_xscale("symlog", linthresh=1) if min(map(float, spec.x), default=1) <= 0 else fig.axes[0].set_xscale("log")
    return fig


def heatmap(spec: Heatmap) -> Any:
    """A Heatmap spec: rows down, columns across, each labelled (every k-th where there are many),
    a diverging scale centred on 0 where the spec asks for one."""
    plt = pyplot()
    z = np.asarray(spec.z, dtype=np.float64)
    rows, cols = z.shape
    size = (min(16, max(6.4, 2.5 + 0.28 * cols)), min(12, max(4.0, 1.8 + 0.3 * rows)))  # a small grid stays readable
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    kw: dict[str, Any] = {"cmap": SEQUENTIAL}
    if spec.range is not None:  # one scale for every such figure (CKA: 0 to 1)
        kw.update(vmin=spec.range[0], vmax=spec.range[1])
    if spec.centre is not None:  # (about the centre, to the furthest value, or over the spec's fixed range)
        lo, hi = spec.range if spec.range is not None else diverging_range(z, spec.centre)
        kw = {"cmap": diverging_cmap(), "vmin": lo, "vmax": hi}
    ax.set_facecolor(NO_VALUE)  # (a NaN cell is left transparent: grey, never a colour of the scale)
    image = ax.imshow(z, aspect="auto", interpolation="nearest", **kw)
    if spec.cells is not None and rows * cols <= 2000:  # each cell's text (spec.cells), readable on its colour
        norm = image.norm
        for r in range(rows):
            for c in range(cols):
                shade = norm(z[r, c]) if np.isfinite(z[r, c]) else None
                dark = shade is not None and (shade < 0.6 if spec.centre is None else abs(shade - 0.5) > 0.3)
                ax.text(c, r, spec.cells[r][c], ha="center", va="center", fontsize=10 if rows * cols <= 64 else 6,
                        color="white" if dark else "black")
    for axis, labels, n in ((ax.xaxis, spec.x, cols), (ax.yaxis, spec.y, rows)):
        step = max(1, -(-n // 40))
        where = list(range(0, n, step))
        axis.set_ticks(where, [labels[i] for i in where] if labels is not None else [str(i) for i in where], fontsize=9 if n <= 16 else 7)
    ax.tick_params(axis="x", rotation=90 if cols > 8 else 0)
    upright_if_crowded(fig, ax)
    ax.set_xlabel(spec.xlabel)
    ax.set_ylabel(spec.ylabel)
    ax.set_title(spec.title)
    bar = fig.colorbar(image, ax=ax, label=spec.label + no_value_note(z).replace(" (", "\n(", 1), extend=beyond_range(z, spec.range))
    tidy_ticks(bar.ax.yaxis)
    return fig


def sweep_lines(xs: Sequence[Any], series: Mapping[str, Sequence[float]], xlabel: str, ylabel: str, title: str,
                in_order: bool = False, references: Sequence[str] = ()) -> Any:
    """One line per capture against the swept value; integer or string values get a categorical axis
    (sorted, unless `in_order`: categories given in the order to draw them). The series named in
    `references` are baselines (chance): grey, dashed, no markers."""
    plt = pyplot()
    categorical = in_order or is_categorical(xs)
    fig, ax = plt.subplots(figsize=(7.5, 4.6), layout="constrained")
    order = list(range(len(xs))) if categorical else sorted(range(len(xs)), key=lambda i: float(xs[i]))
    if categorical and not in_order:
        order = sorted(order, key=lambda i: category_key(xs[i]))
    positions = list(range(len(order))) if categorical else [float(xs[i]) for i in order]
    for label, ys in series.items():
        style = {"color": "0.45", "linestyle": "--", **({"marker": "_", "markersize": 24} if len(order) == 1 else {})} \
            if label in references else {"marker": "o", "linestyle": ":" if categorical else "-"}
        ax.plot(positions, [ys[i] if ys[i] is not None else np.nan for i in order], label=label, **style)
    if categorical:
        step = max(1, -(-len(order) // 40))  # every k-th label where there are many
        ax.set_xticks(positions[::step], ["null" if xs[i] is None else str(xs[i]) for i in order][::step])
        upright_if_crowded(fig, ax)
    else:  # (a few swept values are the ticks)
        value_ticks(ax.xaxis, positions)
    tidy_ticks(ax.yaxis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(loc="best")
    return fig

