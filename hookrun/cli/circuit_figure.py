"""plot's circuit: a Circuit spec (analysis/report/figure_specs.py) as a matplotlib figure, as the
report draws it with plotly (analysis/report/plotly_figures.py:circuit).

    fig = circuit(Circuit(nodes, x, y, [(0, 1, 0.3, "embed -> L0.H0.q")], "circuit · atp · logit diff"))

One bowed line per edge (the same curve as the report's), red positive and blue negative, its width
by |score| (0.5 to 6.5 points, as the report's pixels), then the nodes with their short labels and a
legend that reads sign and width; no axes (the nodes' names say where they are).
"""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

from hookrun.analysis.report.figure_specs import NEGATIVE, POSITIVE, Circuit
from hookrun.analysis.report.plotly_figures import CIRCUIT_UNIT, bowed
from hookrun.cli.figures import pyplot


def width(score: float, top: float) -> float:
    return 0.5 + 6 * abs(score) / top


def circuit(spec: Circuit) -> Any:
    plt = pyplot()
    lo, hi = min(spec.x or [0.0]) - 1, max(spec.x or [0.0]) + 1
    bottom, up = min(spec.y or [0.0]) - 1, max(spec.y or [0.0]) + 1
    fig, ax = plt.subplots(figsize=(max(7.2, CIRCUIT_UNIT * (hi - lo) / 100 + 0.8), CIRCUIT_UNIT / 2 * (up - bottom) / 100 + 1.6),
                           layout="constrained")
    nodes, xs, ys, links, *_ = astuple(spec)  # links: (writer, reader, score, label) (cli/ names no kind: test_route)
    top = max([abs(e[2]) for e in links] or [1.0]) or 1.0
    for i, j, s, _ in links:
        bx, by = bowed(xs[i], ys[i], xs[j], ys[j])
        ax.plot(bx, by, color=POSITIVE if s > 0 else NEGATIVE, linewidth=width(s, top), alpha=0.8, solid_capstyle="round")
    ax.scatter(spec.x, spec.y, s=12, color="#444444", zorder=3)
    for label, x, y in zip(spec.labels or spec.nodes, spec.x, spec.y, strict=True):
        ax.annotate(label, (x, y), xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=7)
    for name, colour, w in ((f"positive: the writer's patch raises the metric (|score| {top:.3g})", POSITIVE, width(top, top)),
                            (f"negative: it lowers the metric (|score| {top:.3g})", NEGATIVE, width(top, top)),
                            (f"width: |score| {top / 4:.3g}", "#777777", width(top / 4, top))):
        ax.plot([], [], color=colour, linewidth=w, label=name)
    ax.set_xlim(lo, hi)
    ax.set_ylim(bottom, up)
    ax.set_axis_off()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0), fontsize=8, ncols=1, frameon=False)
    ax.set_title(spec.title)
    return fig
