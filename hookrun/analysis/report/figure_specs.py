"""What to draw, decided once: figure specs that `plot` renders with matplotlib (cli/figures.py)
and `report` with plotly (analysis/report/plotly_figures.py).

    spec = Heatmap(z=np.eye(3), title="grid", x=["a", "b", "c"], xlabel="position", ylabel="module")
    spec = Lines(x=[0.0, 0.5, 1.0], series={"ce_intervened": [5.1, 1.7, 1.2]}, xlabel="params.factor",
                 ylabel="ce_intervened", title="ce_intervened against params.factor")

A spec holds plain arrays and labels, nothing else: it reads no file and knows no renderer.
`x`/`y` are one label per column/row (token text, module names) or None for positions; a
heatmap's `hover` names its axes in the value shown under the pointer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Heatmap:
    z: np.ndarray  # (rows, cols)
    title: str
    x: Sequence[str] | None = None
    y: Sequence[str] | None = None
    xlabel: str = ""
    ylabel: str = ""
    label: str = "value"  # the colour bar
    centre: float | None = None  # a diverging scale, symmetric about this value (patching grids)


@dataclass
class Lines:
    x: Sequence[Any]
    series: dict[str, Sequence[float | None]]
    xlabel: str
    ylabel: str
    title: str


@dataclass
class Circuit:
    """A residual graph's top edges: nodes placed by layer, each edge drawn with width by |score|, colour by sign."""

    nodes: list[str]
    x: list[float]
    y: list[float]
    edges: list[tuple[int, int, float, str]]  # (writer node, reader node, score, label)
    title: str


@dataclass
class Histogram:
    counts: np.ndarray  # (bins,)
    edges: np.ndarray  # (bins + 1,)
    title: str
    xlabel: str
    note: str = ""
    log: bool = True


@dataclass
class Scatter:
    x: np.ndarray
    y: np.ndarray
    xlabel: str
    ylabel: str
    title: str
    labels: Sequence[str] = field(default_factory=list)


def is_categorical(values: Sequence[Any]) -> bool:
    """Whole numbers (seeds, layer indices) and strings are categories; any float makes a scale."""
    return not any(isinstance(v, float) for v in values) or any(isinstance(v, str) for v in values)


def histogram_of(values: np.ndarray, title: str, xlabel: str, note: str = "", bins: int = 60) -> Histogram:
    """A histogram spec of the finite values (an empty one where there are none)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    if not values.size:
        return Histogram(np.zeros(0), np.zeros(1), title, xlabel, note or "no finite values")
    lo, hi = float(values.min()), float(values.max())
    counts, edges = np.histogram(values, bins=bins, range=(lo, hi if hi > lo else lo + 1))
    return Histogram(counts, edges, title, xlabel, note)


def sweep_charts(table: Any, swept: Sequence[str], metrics: Sequence[str]) -> list[Lines]:
    """One chart per (metric, swept parameter): the metric of each job against the parameter's
    value, with the jobs' other swept values as separate lines. A metric with no number in any
    job makes no chart."""
    charts = []
    for metric in metrics:
        ys_all = table.column(metric)
        if not any(_number(v) is not None for v in ys_all):
            continue
        for key in swept:
            others = [k for k in swept if k != key]
            groups: dict[str, list[int]] = {}
            for i, row in enumerate(table.rows):
                name = ", ".join(f"{k}={row.get(k)}" for k in others) or metric
                groups.setdefault(name, []).append(i)
            xs = table.column(key)
            order = sorted(range(len(xs)), key=lambda i: (isinstance(xs[i], str), str(xs[i]) if isinstance(xs[i], str) else xs[i] if xs[i] is not None else 0))
            series = {name: [_number(ys_all[i]) if i in rows else None for i in order] for name, rows in groups.items()}
            charts.append(Lines([xs[i] for i in order], series, key, metric, f"{metric} against {key}"))
    return charts


def sweep_metrics(table: Any, swept: Sequence[str]) -> list[str]:
    """The columns of a sweep table that hold numbers and are not overrides: evaluation metrics
    first (as the table orders them), then the captures' statistics."""
    skip = {"job", "status", "text", *swept}
    keys = [c for c in table.columns if c not in skip and c not in _overrides(table, swept)]
    return [c for c in keys if any(_number(v) is not None for v in table.column(c))]


def _overrides(table: Any, swept: Sequence[str]) -> set[str]:
    cols = table.columns
    end = cols.index("status") if "status" in cols else 0
    return set(cols[1:end])


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float | np.number):
        f = float(v)
        return f if np.isfinite(f) else None
    return None
