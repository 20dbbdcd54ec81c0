"""plot's scatter: a Scatter spec (analysis/report/figure_specs.py) as a matplotlib figure.

    fig = scatter(Scatter(x, y, "L0 (last training step)", "explained variance (last training step)",
                          "a sweep", labels=["job 0", "job 1"], annotate=True))

What the spec asks for is drawn, nothing else: a y = x line only with `diagonal` (an estimate against
the exact values it estimates: the axes then span both), a legend only where something is named
(`points`, the diagonal), and with `annotate` each point's label beside it, labels that would
overlap moved apart (a thin line back to their point), the axes fitting the points and their labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hookrun.analysis.report.figure_specs import DIVERGING, finite_range
from hookrun.cli.figure_ticks import tidy_ticks
from hookrun.cli.figures import pyplot

LABEL_SIZE = 8  # points


def scatter(spec: Any) -> Any:
    plt = pyplot()
    annotate = bool(getattr(spec, "annotate", False)) and len(spec.labels) == len(spec.x)
    fig, ax = plt.subplots(figsize=(6.4, 4.8) if annotate else (5.2, 4.6), layout="constrained")
    x, y = np.asarray(spec.x, dtype=np.float64), np.asarray(spec.y, dtype=np.float64)
    if getattr(spec, "diagonal", False):
        both = np.concatenate([x, y])
        lo, hi = finite_range(both)
        ax.plot([lo, hi], [lo, hi], linestyle=":", color="#999999", label="y = x")
    ax.scatter(x, y, s=28 if annotate else 14, color=DIVERGING[-2], label=getattr(spec, "points", "") or None, zorder=3)
    if annotate:
        ax.margins(x=0.25, y=0.2)  # (room for the labels inside the axes)
    tidy_ticks(ax.xaxis)
    tidy_ticks(ax.yaxis)
    ax.set_xlabel(spec.xlabel)
    ax.set_ylabel(spec.ylabel)
    ax.set_title(spec.title)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(loc="best")
    if annotate:
        label_points(ax, x, y, [str(t) for t in spec.labels])
    return fig


def label_points(ax: Any, x: np.ndarray, y: np.ndarray, labels: Sequence[str], size: float = LABEL_SIZE) -> None:
    """Each point's label beside it (to its right, or its left in the axes' right half), from the
    lowest point up; a label that would overlap one already placed moves up a line at a time."""
    fig = ax.figure
    fig.draw_without_rendering()  # (the layout settled: pixel positions of the points)
    px = ax.transData.transform(np.column_stack([x, y]))
    unit = fig.dpi / 72  # pixels a point
    line, middle = 1.3 * size * unit, float(np.mean(ax.get_window_extent().intervalx))
    placed: list[tuple[float, float, float]] = []  # (left, right, bottom) in pixels
    for i in sorted(range(len(labels)), key=lambda i: (px[i, 1], px[i, 0])):
        if not np.isfinite(px[i]).all():
            continue
        width = 0.62 * size * unit * len(labels[i])
        left = px[i, 0] >= middle
        x0 = px[i, 0] - 6 * unit - width if left else px[i, 0] + 6 * unit
        bottom = px[i, 1] + 2 * unit
        while any(a < x0 + width and x0 < b and abs(bottom - c) < line for a, b, c in placed):
            bottom += line
        placed.append((x0, x0 + width, bottom))
        moved = bottom - px[i, 1] > line
        ax.annotate(labels[i], (x[i], y[i]), xytext=(-6 if left else 6, (bottom - px[i, 1]) / unit), textcoords="offset points",
                    ha="right" if left else "left", va="bottom", fontsize=size,
                    arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.6} if moved else None)
