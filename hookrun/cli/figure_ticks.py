"""Tick labels that read, on the figures `plot` draws (cli/figures.py).

    tidy_ticks(ax.yaxis)            # at most 5 numbers, scientific notation outside 1e-3 .. 1e4
    value_ticks(ax.xaxis, [1.0, 2.5, 4.0])    # a linear sweep's few values are its ticks
    upright_if_crowded(fig, ax)     # category labels that overlap as drawn stand upright
"""

from __future__ import annotations

from typing import Any


def tidy_ticks(axis: Any, n: int = 5) -> None:
    """At most `n` ticks, in scientific notation outside 1e-3 .. 1e4 (the exponent shown once)."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    axis.set_major_locator(MaxNLocator(n))
    fmt = ScalarFormatter(useMathText=True)
    fmt.set_powerlimits((-3, 4))
    axis.set_major_formatter(fmt)


def value_ticks(axis: Any, values: Any) -> None:
    """A numeric sweep's swept values as its linear axis's ticks, each as written (%g), where they are
    few and uncrowded (figure_specs.value_ticks); else tidy_ticks. (A log axis keeps its decades:
    figures.lines sets the scale after.)"""
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    from hookrun.analysis.report.figure_specs import value_ticks as few

    ticks = few(values)
    if ticks is None:
        return tidy_ticks(axis, 6)
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FixedFormatter([f"{t:g}" for t in ticks]))
    axis.set_minor_locator(NullLocator())


def upright_if_crowded(fig: Any, ax: Any) -> None:
    """Column labels that overlap as drawn (six transformer.h.* names, a 24-layer model's) stand
    upright, and the figure grows by their height so the plot keeps its own."""
    from hookrun.cli.figure_titles import literal_text

    literal_text(fig)  # (drawn here first: a '$' in a label must be a dollar before it is)
    fig.draw_without_rendering()
    ticks = [t for t in ax.get_xticklabels() if t.get_text()]
    if not ticks or ticks[0].get_rotation() == 90:
        return
    boxes = [t.get_window_extent() for t in ticks]
    if any(a.x1 + 3 > b.x0 for a, b in zip(boxes, boxes[1:], strict=False)):
        for t in ticks:
            t.set_rotation(90)
        width, height = fig.get_size_inches()
        fig.set_size_inches(width, height + min(4.0, max(b.width for b in boxes) / fig.dpi))
