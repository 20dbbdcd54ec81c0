"""The report's renderer: figure specs (analysis/report/figure_specs.py) as plotly figures, in the JSON
form `Plotly.newPlot` takes (`{"data": [...], "layout": {...}}`).

    fig = to_plotly(Heatmap(z=np.eye(2), title="t", x=["a", "b"]))
    fig["data"][0]["type"]        # 'heatmap'

Text that plotly draws (tick labels, hover text, titles) goes through plotly's own small markup
language (`<b>`, `<br>`): every label from the file is escaped (`&lt;`) so token text is shown as
written and never read as markup. Token axes are numeric with one tick text per position, so a
token that occurs twice keeps both of its places (a categorical axis would merge them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hookrun.analysis.report.figure_specs import (
    DIVERGING,
    Circuit,
    Heatmap,
    Histogram,
    Lines,
    Scatter,
    diverging_range,
    is_categorical,
)

FONT = {"size": 11}
COLORSCALE = [[i / (len(DIVERGING) - 1), c] for i, c in enumerate(DIVERGING)]  # the shared scale: positive red


def escape(text: object) -> str:
    """A label as plotly should show it: its own markup characters made entities."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_plotly(spec: Any) -> dict:
    if isinstance(spec, Heatmap):
        return heatmap(spec)
    if isinstance(spec, Lines):
        return lines(spec)
    if isinstance(spec, Histogram):
        return histogram(spec)
    if isinstance(spec, Scatter):
        return scatter(spec)
    if isinstance(spec, Circuit):
        return circuit(spec)
    raise TypeError(f"no plotly renderer for {type(spec).__name__}")


def _layout(title: str, xlabel: str, ylabel: str, **extra: Any) -> dict:
    return {"title": {"text": escape(title), "font": {"size": 12}}, "font": FONT, "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
            "xaxis": {"title": {"text": escape(xlabel)}}, "yaxis": {"title": {"text": escape(ylabel)}}, **extra}


def _ticks(labels: Sequence[str] | None, n: int, most: int = 40) -> dict:
    if labels is None:
        return {}
    step = max(1, -(-n // most))
    where = list(range(0, n, step))
    return {"tickmode": "array", "tickvals": where, "ticktext": [escape(labels[i]) for i in where], "tickfont": {"size": 9}}


def heatmap(spec: Heatmap) -> dict:
    z = np.asarray(spec.z, dtype=np.float64)
    rows, cols = z.shape
    xs = [escape(t) for t in spec.x] if spec.x is not None else [str(i) for i in range(cols)]
    ys = [escape(t) for t in spec.y] if spec.y is not None else [str(i) for i in range(rows)]
    where = [[f"{ys[r]} · {xs[c]}" + (f" · {escape(spec.cells[r][c])}" if spec.cells is not None else "") for c in range(cols)]
             for r in range(rows)]
    trace: dict[str, Any] = {
        "type": "heatmap", "z": _finite(z), "x": list(range(cols)), "y": list(range(rows)), "customdata": where,
        "hovertemplate": f"{escape(spec.ylabel) or 'row'} · {escape(spec.xlabel) or 'column'}: %{{customdata}}<br>"
                         f"{escape(spec.label)}: %{{z:.6g}}<extra></extra>",
        "colorscale": COLORSCALE if spec.centre is not None else "Viridis", "colorbar": {"title": {"text": escape(spec.label)}},
    }
    if spec.centre is not None:
        lo, hi = diverging_range(z, spec.centre)
        trace.update(zmid=spec.centre, zmin=lo, zmax=hi)
    elif spec.range is not None:
        trace.update(zmin=spec.range[0], zmax=spec.range[1])
    if spec.cells is not None and rows * cols <= 4000:
        trace.update(text=[[escape(t) for t in row] for row in spec.cells], texttemplate="%{text}", textfont={"size": 8})
    layout = _layout(spec.title, spec.xlabel, spec.ylabel)
    layout["xaxis"].update(_ticks(spec.x, cols), showgrid=False, automargin=True)
    layout["yaxis"].update(_ticks(spec.y, rows), showgrid=False, autorange="reversed", automargin=True)
    layout["height"] = int(min(720, max(260, 18 * rows + 140)))
    return {"data": [trace], "layout": layout}


def lines(spec: Lines) -> dict:
    categorical = is_categorical(list(spec.x))
    xs = [str(v) for v in spec.x] if categorical else list(spec.x)
    data = [{"type": "scatter", "mode": "lines+markers", "name": escape(name), "x": xs, "y": list(ys),
             "hovertemplate": f"{escape(spec.xlabel)} %{{x}}<br>{escape(spec.ylabel)}: %{{y:.6g}}<extra>{escape(name)}</extra>"}
            for name, ys in spec.series.items()]
    layout = _layout(spec.title, spec.xlabel, spec.ylabel, height=340, showlegend=len(data) > 1)
    if categorical:
        layout["xaxis"]["type"] = "category"
    elif getattr(spec, "log_x", False):
        layout["xaxis"]["type"] = "log"
    return {"data": data, "layout": layout}


def histogram(spec: Histogram) -> dict:
    centres = ((spec.edges[:-1] + spec.edges[1:]) / 2).tolist() if len(spec.counts) else []
    width = float(spec.edges[1] - spec.edges[0]) if len(spec.counts) else 1.0
    data = [{"type": "bar", "x": centres, "y": spec.counts.tolist(), "width": width, "marker": {"color": "#3b6ea5"},
             "hovertemplate": f"{escape(spec.xlabel)} %{{x:.4g}}: %{{y}} values<extra></extra>"}]
    title = spec.title + (f" ({spec.note})" if spec.note else "")
    log = spec.log and len(spec.counts) and int(spec.counts.max()) >= 10  # below 10 a log axis has no decade to mark
    layout = _layout(title, spec.xlabel, "count" + (" (log scale)" if log else ""), height=300, bargap=0)
    if log:  # one tick per power of ten (1, 10, 100, ...): plotly's default labels 2..9 too, and they run together
        layout["yaxis"].update(type="log", dtick=1, exponentformat="power", minor={"showgrid": False})
    return {"data": data, "layout": layout}


def scatter(spec: Scatter) -> dict:
    x, y = np.asarray(spec.x, dtype=np.float64), np.asarray(spec.y, dtype=np.float64)
    lo = float(np.nanmin(np.concatenate([x, y]))) if x.size else 0.0
    hi = float(np.nanmax(np.concatenate([x, y]))) if x.size else 1.0
    data = [{"type": "scatter", "mode": "markers", "x": _finite(x), "y": _finite(y), "name": "cells",
             "text": [escape(t) for t in spec.labels] or None,
             "hovertemplate": f"%{{text}}<br>{escape(spec.xlabel)} %{{x:.6g}}<br>{escape(spec.ylabel)} %{{y:.6g}}<extra></extra>"},
            {"type": "scatter", "mode": "lines", "x": [lo, hi], "y": [lo, hi], "name": "y = x",
             "line": {"dash": "dot", "color": "#999999"}, "hoverinfo": "skip"}]
    return {"data": data, "layout": _layout(spec.title, spec.xlabel, spec.ylabel, height=380)}


def circuit(spec: Circuit) -> dict:
    """One line per edge (width by |score|, red positive, blue negative), then the nodes with their names."""
    top = max([abs(e[2]) for e in spec.edges] or [1.0]) or 1.0
    data = [{"type": "scatter", "mode": "lines", "x": [spec.x[i], spec.x[j]], "y": [spec.y[i], spec.y[j]],
             "line": {"width": 0.5 + 6 * abs(s) / top, "color": "#b2182b" if s > 0 else "#2166ac"}, "opacity": 0.8,
             "hovertemplate": f"{escape(label)}: {s:.4g}<extra></extra>", "showlegend": False}
            for i, j, s, label in spec.edges]
    data.append({"type": "scatter", "mode": "markers+text", "x": spec.x, "y": spec.y, "text": [escape(n) for n in spec.nodes],
                 "textposition": "middle right", "textfont": {"size": 9}, "marker": {"size": 7, "color": "#444444"},
                 "hoverinfo": "text", "showlegend": False})
    layout = _layout(spec.title, "", "", height=int(min(900, 60 * (max(spec.y or [0]) + 2))))
    for axis in ("xaxis", "yaxis"):  # the nodes' names say where they are
        layout[axis].update(showticklabels=False, showgrid=False, zeroline=False)
    return {"data": data, "layout": layout}


def _finite(a: np.ndarray) -> list:
    """Nested lists with NaN/inf as None (JSON has no NaN; plotly draws None as a gap)."""
    a = np.asarray(a, dtype=np.float64)
    flat = [float(f"{v:.7g}") if np.isfinite(v) else None for v in a.ravel().tolist()]
    if a.ndim <= 1:
        return flat
    cols = a.shape[-1]
    return [flat[i : i + cols] for i in range(0, len(flat), cols)]
