"""The report's renderer: figure specs (analysis/report/figure_specs.py) as plotly figures, in the JSON
form `Plotly.newPlot` takes (`{"data": [...], "layout": {...}}`).

    fig = to_plotly(Heatmap(z=np.eye(2), title="t", x=["a", "b"]))
    fig["data"][0]["type"]        # 'heatmap'

Text that plotly draws (tick labels, hover text, titles) goes through plotly's own small markup
language (`<b>`, `<br>`) and hover templates (`%{y}`): every label from the file is escaped (`&lt;`,
`%&#123;`) so token text is shown as written and never read as markup nor as a template. Token axes are numeric with one tick text per position, so a
token that occurs twice keeps both of its places (a categorical axis would merge them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hookrun.analysis.report.figure_specs import (
    DIVERGING,
    NEGATIVE,
    NO_VALUE,
    POSITIVE,
    Circuit,
    Heatmap,
    Histogram,
    Lines,
    Scatter,
    beyond_range,
    diverging_range,
    finite_range,
    is_categorical,
    no_value_note,
    value_ticks,
)

FONT = {"size": 11}
COLORSCALE = [[i / (len(DIVERGING) - 1), c] for i, c in enumerate(DIVERGING)]  # the shared scale: positive red


def escape(text: object) -> str:
    """A label as plotly should show it: its own markup characters made entities, and the `{` of a `%{`
    too (plotly reads `%{y}` in a hover template or a legend's `<extra>` as a value to put there: a swept
    value `%{y}` was shown as the point's y). plotly turns `&#123;` back into `{` where it draws the text."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("%{", "%&#123;")


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


FIG_WIDTH = 420  # the page's figures side by side are this wide (report.css: .figs .fig; one with its own width: that)
TITLE_EM = 0.6  # a title character's width, on average at most, in em (of the 12 px title font)


def title_lines(text: str, width: int = FIG_WIDTH, size: int = 12) -> list[str]:
    """A title broken at spaces into lines that fit `width` pixels at `size` px (each line escaped)."""
    import textwrap

    most = max(16, int((width - 24) / (TITLE_EM * size)))
    return [escape(line) for line in textwrap.wrap(str(text), most, break_long_words=False)] or [""]


def title_layout(text: str, width: int = FIG_WIDTH) -> tuple[dict, int]:
    """plotly's title for `text`, wrapped to fit the figure (lines joined by <br>), and the top
    margin that holds its lines."""
    lines = title_lines(text, width)
    return {"text": "<br>".join(lines), "font": {"size": 12}}, 40 + 16 * (len(lines) - 1)


def _layout(title: str, xlabel: str, ylabel: str, **extra: Any) -> dict:
    head, top = title_layout(title, int(extra.get("width") or FIG_WIDTH))
    return {"title": head, "font": FONT, "margin": {"l": 60, "r": 20, "t": top, "b": 50},
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
        "colorscale": COLORSCALE if spec.centre is not None else "Viridis", "colorbar": {"title": {"text": escape(spec.bar_label or spec.label)}},
    }
    if spec.centre is not None:  # (about the centre, to the furthest value, or over the spec's fixed range)
        lo, hi = spec.range if spec.range is not None else diverging_range(z, spec.centre)
        trace.update(zmid=spec.centre, zmin=lo, zmax=hi)
    elif spec.range is not None:
        trace.update(zmin=spec.range[0], zmax=spec.range[1])
    if no_value_note(z):  # (a NaN or inf cell: a gap, grey; the bar says how many)
        trace["colorbar"]["title"]["text"] += f"<br><sub>{escape(no_value_note(z).strip(' ()'))}</sub>"
    beyond = beyond_range(z, spec.range)
    if beyond != "neither":  # (plotly's bar has no arrow: a cell beyond takes the end's colour, and the bar says so)
        ends = {"min": f"below {spec.range[0]:g}", "max": f"above {spec.range[1]:g}",
                "both": f"below {spec.range[0]:g} or above {spec.range[1]:g}"}[beyond]
        trace["colorbar"]["title"]["text"] += f"<br><sub>cells {ends}:<br>the end's colour</sub>"
    if spec.cells is not None and rows * cols <= 4000:
        trace.update(text=[[escape(t) for t in row] for row in spec.cells], texttemplate="%{text}", textfont={"size": 8})
    layout = _layout(spec.title, spec.xlabel, spec.ylabel, plot_bgcolor=NO_VALUE)  # (a NaN cell: a gap, grey)
    layout["xaxis"].update(_ticks(spec.x, cols), showgrid=False, automargin=True)
    layout["yaxis"].update(_ticks(spec.y, rows), showgrid=False, autorange="reversed", automargin=True)
    layout["height"] = int(min(720, max(260, 18 * rows + 140)))
    return {"data": [trace], "layout": layout}


def lines(spec: Lines) -> dict:
    categorical = getattr(spec, "in_order", False) or is_categorical(list(spec.x))  # (plotly keeps their order)
    xs = [escape(v) for v in spec.x] if categorical else list(spec.x)  # (a category is a swept value's text: shown, never markup)
    baseline = {"mode": "lines", "line": {"dash": "dash", "color": "#737373"}}  # (a reference: chance)
    data = [{"type": "scatter", "mode": "lines+markers", "name": escape(name), "x": xs, "y": list(ys),
             "hovertemplate": f"{escape(spec.xlabel)} %{{x}}<br>{escape(spec.ylabel)}: %{{y:.6g}}<extra>{escape(name)}</extra>",
             **(baseline if name in getattr(spec, "references", ()) else {})}
            for name, ys in spec.series.items()]
    layout = _layout(spec.title, spec.xlabel, spec.ylabel, height=340, showlegend=len(data) > 1)
    if categorical:
        layout["xaxis"]["type"] = "category"
    elif getattr(spec, "log_x", False) and min(map(float, xs), default=1) <= 0:  # plotly's log axis drops a 0: symlog by hand
        for trace in data:  # (as matplotlib's symlog, linear from 0 to 1: log10(1 + x); the hover the value itself)
            trace.update(x=[_symlog(x) for x in xs], customdata=xs, hovertemplate=trace["hovertemplate"].replace("%{x}", "%{customdata}"))
        ticks = [0.0, *(10.0**e for e in range(int(np.log10(max(1.0, max(map(abs, xs))))) + 1))]
        layout["xaxis"].update(tickvals=[_symlog(t) for t in ticks], ticktext=[f"{t:g}" for t in ticks])
    elif getattr(spec, "log_x", False):
        layout["xaxis"]["type"] = "log"
    elif (ticks := value_ticks(xs)) is not None:  # (a linear sweep's few values are its ticks, as plot draws them)
        layout["xaxis"].update(tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    return {"data": data, "layout": layout}


def _symlog(x: float) -> float:
    return float(np.sign(x) * np.log10(1 + abs(x)))


def histogram(spec: Histogram) -> dict:
    centres = ((spec.edges[:-1] + spec.edges[1:]) / 2).tolist() if len(spec.counts) else []
    width = float(spec.edges[1] - spec.edges[0]) if len(spec.counts) else 1.0
    data = [{"type": "bar", "x": centres, "y": spec.counts.tolist(), "width": width, "marker": {"color": "#3b6ea5"},
             "hovertemplate": f"{escape(spec.xlabel)} %{{x:.4g}}: %{{y}} values<extra></extra>"}]
    title = spec.title + (f" ({spec.note})" if spec.note else "")
    log = spec.log and len(spec.counts) and int(spec.counts.max()) >= 10  # histogram_of: log only over > 2 decades
    layout = _layout(title, spec.xlabel, "count" + (" (log scale)" if log else ""), height=300, bargap=0)
    if log:  # one tick per power of ten (1, 10, 100, ...): plotly's default labels 2..9 too, and they run together
        layout["yaxis"].update(type="log", dtick=1, exponentformat="power", minor={"showgrid": False})
    return {"data": data, "layout": layout}


def scatter(spec: Scatter) -> dict:
    """The points (each label on hover); what the spec asks for besides: a y = x line (`diagonal`, the
    axes spanning both), a legend (`points`), each point's label beside it (`annotate`: the axes fit
    the points with room for their labels)."""
    x, y = np.asarray(spec.x, dtype=np.float64), np.asarray(spec.y, dtype=np.float64)
    annotate = spec.annotate and len(spec.labels) == len(x)
    points: dict[str, Any] = {"type": "scatter", "mode": "markers+text" if annotate else "markers", "x": _finite(x),
                              "y": _finite(y), "name": escape(spec.points or "points"), "text": [escape(t) for t in spec.labels] or None,
                              "hovertemplate": f"%{{text}}<br>{escape(spec.xlabel)} %{{x:.6g}}<br>{escape(spec.ylabel)} %{{y:.6g}}<extra></extra>"}
    data = [points]
    layout = _layout(spec.title, spec.xlabel, spec.ylabel, height=380)
    if spec.diagonal:
        lo, hi = finite_range(np.concatenate([x, y]))
        data.append({"type": "scatter", "mode": "lines", "x": [lo, hi], "y": [lo, hi], "name": "y = x",
                     "line": {"dash": "dot", "color": "#999999"}, "hoverinfo": "skip"})
    if not spec.points:
        points["showlegend"] = False
        layout["showlegend"] = spec.diagonal
    if annotate:
        points.update(textposition=_sides(x, y), textfont={"size": 9}, marker={"size": 8})
        layout["xaxis"]["range"], layout["yaxis"]["range"] = _padded(x, 0.3), _padded(y, 0.2)
    return {"data": data, "layout": layout}


def _padded(v: np.ndarray, pad: float) -> list[float]:
    """The finite values' span, widened by `pad` of it at each end (a span of 0: by a tenth of the value, or 1)."""
    v = v[np.isfinite(v)]
    lo, hi = (float(v.min()), float(v.max())) if v.size else (0.0, 1.0)
    span = hi - lo or (abs(hi) / 10 or 1.0)
    return [lo - pad * span, hi + pad * span]


def _sides(x: np.ndarray, y: np.ndarray) -> list[str]:
    """Where each point's label goes, on the axes' scale: above it, unless another point is close above
    (then below it), and beside it (away from the middle) where points are close on both sides."""
    sx, sy = (float(np.ptp(v[np.isfinite(v)])) if np.isfinite(v).any() else 1.0 for v in (x, y))
    nx, ny = x / (sx or 1.0), y / (sy or 1.0)
    mid = float(np.nanmean(nx)) if len(x) else 0.0
    out = []
    for i in range(len(x)):
        near = [j for j in range(len(x)) if j != i and abs(nx[i] - nx[j]) < 0.3 and abs(ny[i] - ny[j]) < 0.12]
        above = any((ny[j], j) > (ny[i], i) for j in near)
        below = any((ny[j], j) < (ny[i], i) for j in near)
        out.append("top center" if not above else "bottom center" if not below
                   else "middle left" if nx[i] > mid else "middle right")
    return out


CIRCUIT_UNIT = 70  # pixels per head column and per row of a circuit (labels of 8 characters fit in one)


def circuit(spec: Circuit) -> dict:
    """One curve per edge (width by |score|, red positive, blue negative; bowed, so edges between
    nodes of one column do not lie on each other), then the nodes with their short labels (full
    names on hover), and a legend that reads sign and width. The axes span every node with a
    margin of one unit, at CIRCUIT_UNIT pixels a column, so no label is cut off."""
    top = max([abs(e[2]) for e in spec.edges] or [1.0]) or 1.0
    width = lambda s: 0.5 + 6 * abs(s) / top  # noqa: E731
    data = []
    for i, j, s, label in spec.edges:
        xs, ys = bowed(spec.x[i], spec.y[i], spec.x[j], spec.y[j])
        data.append({"type": "scatter", "mode": "lines", "x": xs, "y": ys, "line": {"width": width(s), "color": POSITIVE if s > 0 else NEGATIVE},
                     "opacity": 0.8, "hovertemplate": f"{escape(label)}: {s:.4g}<extra></extra>", "showlegend": False})
    labels = spec.labels or spec.nodes
    data.append({"type": "scatter", "mode": "markers+text", "x": spec.x, "y": spec.y, "text": [escape(n) for n in labels],
                 "hovertext": [escape(n) for n in spec.nodes], "textposition": "top center", "textfont": {"size": 8},
                 "marker": {"size": 6, "color": "#444444"}, "hoverinfo": "text", "showlegend": False})
    for name, colour, w in ((f"positive: the writer's patch raises the metric (|score| {top:.3g})", POSITIVE, width(top)),
                            (f"negative: it lowers the metric (|score| {top:.3g})", NEGATIVE, width(top)),
                            (f"width: |score| {top / 4:.3g}", "#777777", width(top / 4))):
        data.append({"type": "scatter", "mode": "lines", "x": [None], "y": [None], "name": escape(name),
                     "line": {"width": w, "color": colour}, "showlegend": True, "hoverinfo": "skip"})
    lo, hi = min(spec.x or [0.0]) - 1, max(spec.x or [0.0]) + 1
    bottom, up = min(spec.y or [0.0]) - 1, max(spec.y or [0.0]) + 1
    layout = _layout(spec.title, "", "", width=int(max(720, CIRCUIT_UNIT * (hi - lo) + 80)), height=int(CIRCUIT_UNIT / 2 * (up - bottom) + 160),
                     legend={"orientation": "h", "x": 0, "y": -0.02, "yanchor": "top"})
    layout["xaxis"].update(range=[lo, hi])
    layout["yaxis"].update(range=[bottom, up])
    for axis in ("xaxis", "yaxis"):  # the nodes' names say where they are
        layout[axis].update(showticklabels=False, showgrid=False, zeroline=False)
    return {"data": data, "layout": layout}


def bowed(x0: float, y0: float, x1: float, y1: float, points: int = 12) -> tuple[list[float], list[float]]:
    """A quadratic curve from (x0, y0) to (x1, y1) bowed sideways (its control point a fifth of its
    length off the straight line, a row counted as half a column, as they are drawn): two edges
    between nodes of one column, of different lengths, take different paths."""
    dx, dy = x1 - x0, (y1 - y0) / 2
    cx, cy = (x0 + x1) / 2 - 0.2 * dy, (y0 + y1) / 2 + 0.2 * dx * 2
    t = np.linspace(0, 1, points)
    xs = (1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t ** 2 * x1
    ys = (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t ** 2 * y1
    return [round(float(v), 4) for v in xs], [round(float(v), 4) for v in ys]


def _finite(a: np.ndarray) -> list:
    """Nested lists with NaN/inf as None (JSON has no NaN; plotly draws None as a gap)."""
    a = np.asarray(a, dtype=np.float64)
    flat = [float(f"{v:.7g}") if np.isfinite(v) else None for v in a.ravel().tolist()]
    if a.ndim <= 1:
        return flat
    cols = a.shape[-1]
    return [flat[i : i + cols] for i in range(0, len(flat), cols)]
