"""Titles that fit: every title of a matplotlib figure wrapped (then made smaller) until it lies
inside the figure, as `plot` saves it (cli/figures.py's save calls fit_titles).

    fig.suptitle("a long run label · hook blocks · layer1.0 · output")
    fit_titles(fig)                       # wrapped at spaces to the figure's width; taller where an axis label needs it
    literal_text(fig)                     # every text as written: a '$' is a dollar, never maths
    [t.get_text() for t in titles(fig)]   # the suptitle and each axes' titles that show something
"""

from __future__ import annotations

from typing import Any


def titles(fig: Any) -> list[Any]:
    """The figure's title texts that show something: its suptitle and each axes' titles."""
    out = [fig._suptitle] if getattr(fig, "_suptitle", None) is not None else []
    for ax in fig.axes:
        out += [t for t in (ax.title, ax._left_title, ax._right_title)]
    return [t for t in out if t.get_text() and t.get_visible()]


def literal_text(fig: Any) -> None:
    """Every text of the figure shown as written: names of modules, classes, tokens and swept values
    ('$\\frac$', 'cost $5-$10', 'US\\$ 5') would otherwise be matplotlib's maths (or its parse error),
    and outside maths matplotlib draws '\\$' as '$'. Each text is drawn with parse_math off; the tick
    labels given as text (a Fixed or Func formatter) have each '$' escaped once ('\\$' drawn '$',
    '\\\\$' drawn '\\$'); the numbers tick formatters write as maths ('$\\mathdefault{...}$', an axis'
    offset '\\times10^{3}') are theirs and are left. Running it twice changes nothing."""
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter, FuncFormatter

    from hookrun.text_labels import visible

    def plain(s: str) -> str:
        return visible(s).replace("$", "\\$")

    texts = fig.findobj(Text)  # (first: it makes each axis' ticks for its current locations)
    axes = [a for ax in fig.axes for a in (ax.xaxis, ax.yaxis)]
    numbers = {id(t) for a in axes for t in (a.offsetText, *(x for tick in (*a.majorTicks, *a.minorTicks)
                                                                 for x in (tick.label1, tick.label2)))}
    for t in texts:
        if id(t) not in numbers:
            t.set_parse_math(False)
            t.set_text(visible(t.get_text()))  # (a carriage return or ESC as its escape: drawn, never acted on)
    for f in (a.get_major_formatter() for a in axes):
        if getattr(f, "_hookrun_literal", False):
            continue
        if isinstance(f, FixedFormatter):  # (labels given as such: set_ticks(where, labels) is a FuncFormatter)
            f.seq = [plain(s) for s in f.seq]
        elif isinstance(f, FuncFormatter):
            f.func = lambda x, pos=None, given=f.func: plain(given(x, pos))
        f._hookrun_literal = True


def _span(fig: Any, t: Any) -> tuple[float, float]:
    """Where title `t` may lie across: the figure, and for an axes' title only up to the nearest
    titled axes beside it in its row (a row of samples' titles must not run into each other)."""
    lo, hi = fig.bbox.x0, fig.bbox.x1
    own = next((ax for ax in fig.axes if t in (ax.title, ax._left_title, ax._right_title)), None)
    if own is None:
        return lo, hi
    me = own.get_window_extent()
    for ax in fig.axes:
        other = ax.get_window_extent()
        if ax is own or not any(x.get_text() for x in (ax.title, ax._left_title, ax._right_title)) \
                or other.y1 <= me.y0 or other.y0 >= me.y1:  # (untitled, or not in this row)
            continue
        if other.x1 <= me.x0 + 1:
            lo = max(lo, other.x1)
        elif other.x0 >= me.x1 - 1:
            hi = min(hi, other.x0)
    return lo, hi


def fit_titles(fig: Any, margin: float = 4.0, tries: int = 8) -> None:
    """Wrap each title (at spaces, then smaller) until it lies inside the figure, and an axes' title
    between the titled axes beside it (_span): a title centred at x may be at most twice the distance
    from x to the nearer bound wide. Laid out (drawn without rendering: the text's extents are a draw's), then
    measured; savefig renders once."""
    import textwrap

    settled = False  # (the last layout is of the figure as it is now: _tall_enough measures it as it stands)
    for _ in range(tries):
        fig.draw_without_rendering()
        box, wide = fig.bbox, []
        for t in titles(fig):
            ext = t.get_window_extent()
            lo, hi = _span(fig, t)
            centre = (ext.x0 + ext.x1) / 2
            room = 2 * min(centre - lo, hi - centre) - 2 * margin
            if ext.x0 < lo + margin / 2 or ext.x1 > hi - margin / 2 or ext.y1 > box.y1:
                wide.append((t, room / max(ext.width, 1.0)))
        if not wide:
            settled = True
            break
        for t, ratio in wide:
            lines = t.get_text().split("\n")
            longest = max(len(line) for line in lines)
            width = max(12, int(longest * min(ratio, 0.97) * 0.9))
            text = "\n".join(textwrap.fill(line, width, break_long_words=False) for line in lines)
            if text == t.get_text() or ratio <= 0:  # cannot wrap any further (one long word): smaller
                t.set_fontsize(max(5.0, t.get_fontsize() * max(0.5, min(ratio, 0.9))))
            else:
                t.set_text(text)
    _tall_enough(fig, margin, laid_out=settled)


def _tall_enough(fig: Any, margin: float, tries: int = 4, laid_out: bool = False) -> None:
    """Make the figure taller until every axis label (a colour bar's, written along it) lies inside it:
    titles wrapped onto more lines take height from the axes, and a colour bar's label longer than
    the shortened bar ran off the figure ("rad-CAM ..." for "Grad-CAM ..."). The layout gives the
    added height to the axes. laid_out: the figure's last layout is of it as it is (not laid out again first)."""
    for i in range(tries):
        if i or not laid_out:
            fig.draw_without_rendering()
        box = fig.bbox
        over = max([0.0] + [max(box.y0 - e.y0, e.y1 - box.y1) for e in
                            (label.get_window_extent() for ax in fig.axes for label in (ax.xaxis.label, ax.yaxis.label)
                             if label.get_text() and label.get_visible())])
        if over <= 0:
            return
        w, h = fig.get_size_inches()
        fig.set_size_inches(w, h + (2 * over + 2 * margin) / fig.dpi)
