"""What to draw, decided once: figure specs that `plot` renders with matplotlib (cli/figures.py)
and `report` with plotly (analysis/report/plotly_figures.py).

    spec = Heatmap(z=np.eye(3), title="grid", x=["a", "b", "c"], xlabel="position", ylabel="module")
    spec = Lines(x=[0.0, 0.5, 1.0], series={"ce_intervened": [5.1, 1.7, 1.2]}, xlabel="params.factor",
                 ylabel="ce_intervened", title="ce_intervened against params.factor")

A spec holds plain arrays and labels: it reads no file and knows no renderer. `x`/`y`: a label per
column/row (token text, module names) or None for positions; `cells`: a text in each heatmap cell.

The colours are decided once for both renderers (colour_scales.py, named here too): values of either sign (a centred Heatmap,
signed maps) use DIVERGING, centred on `centre` (0 unless a grid's baseline is another value) with
positive values red and negative blue, in `plot` and in `report` alike; values of one sign use
SEQUENTIAL. `skip_reason` says which captures carry no picture and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookrun.analysis.report.colour_scales import (  # noqa: F401 (the colours: figure specs' names too)
    DIVERGING,
    NEGATIVE,
    NO_VALUE,
    POSITIVE,
    SEQUENTIAL,
    beyond_range,
    diverging_range,
    finite_range,
    is_signed,
    no_value_note,
    pattern_scale,
    sample_scale,
    without_mask_fill,
)
from hookrun.analysis.run_notes import run_note
from hookrun.text_labels import natural_key


@dataclass
class Heatmap:
    z: np.ndarray  # (rows, cols)
    title: str
    x: Sequence[str] | None = None
    y: Sequence[str] | None = None
    xlabel: str = ""
    ylabel: str = ""
    label: str = "value"  # the colour bar, and a value's name on hover
    centre: float | None = None  # a diverging scale, symmetric about this value (a kind's grids)
    cells: Sequence[Sequence[str]] | None = None  # a text written in each cell (rows x cols)
    range: tuple[float, float] | None = None  # a fixed colour range (CKA: 0 to 1, sequential; with centre: RSA's -1 to 1)
    bar_label: str = ""  # the colour bar's title where it says more than `label` (how its range was chosen)


@dataclass
class MapRow:
    """Samples' maps side by side, each over its picture where one is known (plot: a row of images).
    `signed`: each map on the diverging scale centred on zero (per sample), its picture in grey; else
    maps in [0, 1] on SEQUENTIAL over the picture in colour."""

    maps: np.ndarray  # (n, H, W): at the pictures' size where there are pictures
    captions: Sequence[str]
    title: str
    label: str  # the colour bar
    indices: np.ndarray  # the samples drawn (plot's --data gives their pictures where the run recorded none)
    pictures: Sequence[np.ndarray] | None = None
    signed: bool = False
    no_pictures: str = ""  # added to the title where no picture is known
    xlabel: str = ""  # the maps' x axis, with whole-number ticks ("token position"); "": no ticks


@dataclass
class Band:
    """One panel of per-sample curves: each row thin and grey, the middle half a band, the mean, and
    a dashed reference (a random order's mean) where there is one."""

    x: np.ndarray
    rows: np.ndarray  # (samples, len(x))
    colour: str
    mean_label: str
    title: str
    xlabel: str
    ylabel: str
    reference: np.ndarray | None = None
    reference_label: str = ""
    ylim: tuple[float, float] | None = None


@dataclass
class Bands:
    panels: list[Band]
    title: str


def skip_reason(info: Any, ds: Any = None) -> str | None:
    """Why a capture gets no histogram (None: it gets one): integer values are token ids or
    indices (their histogram says nothing), lens and top-example rows are shown elsewhere (said where),
    a curve's points (a last dim `step`) are not a distribution, and a capture with no finite value
    has nothing to count."""
    role = str(getattr(info, "role", ""))
    if role.startswith("top."):  # (plot draws no latent: the report lists each one with its top examples)
        return "shown in the report's Latents section (python -m hookrun.report)"
    if role.startswith("lens."):  # (one reason: plot's note stays one line)
        return ("the logit lens pictures (lens_*.png; the report's Logit lens) show KL, the target's rank and "
                "log-probability, and the top-1 token in each cell")
    if str(getattr(info, "hook", "")) == "similarity":  # a similarity run's matrix
        return "drawn as the similarity heatmap"
    if tuple(getattr(info, "dims", ()) or ())[-1:] == ("step",):  # an SAE's training curves, attribution's deletion curves
        return "a curve's points over steps (counters, learning rate, deletion or insertion), not a distribution"
    try:
        kind = np.dtype(str(getattr(info, "dtype", "O"))).kind
    except TypeError:
        kind = "O"
    if kind in "iub":
        return "integer values: token ids or indices, not a distribution"
    if ds is not None and kind == "f" and ds.shape and ds.shape[0] and not np.isfinite(np.asarray(ds[: min(ds.shape[0], 4096)])).any():
        return "no finite value (nothing recomputed or written)"
    return None


def constant_over_space(maps: np.ndarray, rtol: float = 1e-6) -> bool:
    """(samples, channels, H, W) maps where every channel is one value over H x W (a gradient
    after global pooling): a picture of flat squares, so none is drawn."""
    maps = np.asarray(maps, dtype=np.float64)
    if maps.ndim != 4 or maps.shape[-1] * maps.shape[-2] <= 1:
        return maps.ndim == 4 and maps.size > 0
    if not maps.size:
        return False
    finite = np.isfinite(maps)
    if (finite.any(axis=(2, 3)) & ~finite.all(axis=(2, 3))).any():
        return False  # (a channel of finite values and an inf or NaN somewhere varies over space: drawn, those cells blank)
    flat = maps.reshape(*maps.shape[:2], -1)
    same = (flat == flat[..., :1]).all(axis=2) | ~finite.any(axis=(2, 3))  # (one value, or none finite)
    spread = np.where(finite.all(axis=(2, 3)), np.ptp(np.where(finite, maps, 0.0), axis=(2, 3)), 0.0)
    scale = float(np.abs(maps[finite]).max()) if finite.any() else 0.0
    return bool(np.all(same | (spread <= rtol * max(scale, 1e-30))))


@dataclass
class Lines:
    x: Sequence[Any]
    series: dict[str, Sequence[float | None]]
    xlabel: str
    ylabel: str
    title: str
    log_x: bool = False  # a logarithmic x axis (faithfulness against fractions of the edges)
    in_order: bool = False  # x is categories in the order to draw them (hook points by depth), not sorted
    references: tuple[str, ...] = ()  # series drawn as a dashed grey baseline, no markers (chance)


@dataclass
class Circuit:
    """A residual graph's top edges: nodes placed by layer, each edge drawn with width by |score|, colour by sign."""

    nodes: list[str]
    x: list[float]
    y: list[float]
    edges: list[tuple[int, int, float, str]]  # (writer node, reader node, score, label)
    title: str
    labels: list[str] = field(default_factory=list)  # each node's short text (q, k, v under a head); its name on hover


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
    labels: Sequence[str] = field(default_factory=list)  # each point's name (hover; with annotate, beside it too)
    diagonal: bool = False  # a y = x line (an estimate against what it estimates), the axes spanning both
    points: str = ""  # the points' legend name (none, and no diagonal: no legend)
    annotate: bool = False  # each point's label written beside it (a sweep's jobs), the axes fitting the points


@dataclass
class NotShown:
    """Pictures a kind leaves out of a sweep, and why (`job 1 failed: no matrix`): the report's section note says
    it, `plot` prints it as a `not drawn:` line; nothing is drawn."""

    what: str
    why: str


def no_information(spec: Any) -> bool:
    """A heatmap none of whose cells has a value or a text (a grid whose cells were never computed:
    its run stopped before them): a picture of nothing, not drawn by `plot` nor `report`."""
    if not isinstance(spec, Heatmap) or np.isfinite(np.asarray(spec.z, dtype=np.float64)).any():
        return False
    return not any(str(t) for row in (spec.cells or []) for t in row)


def category_key(value: Any) -> tuple:
    """A sort key for a swept value of any type: numbers, then booleans, then null, then strings (by
    natural_key: transformer.h.2 before transformer.h.10)."""
    if isinstance(value, bool):
        return (1, int(value), [])
    if isinstance(value, int | float | np.number):
        return (0, float(value), [])
    return (2, 0, []) if value is None else (3, 0, natural_key(str(value)))


def is_categorical(values: Sequence[Any]) -> bool:
    """Whole numbers (seeds, layer indices) and strings are categories; any float makes a scale."""
    return not any(isinstance(v, float) for v in values) or any(isinstance(v, str | bool) or v is None for v in values)


def value_ticks(values: Sequence[Any], most: int = 12) -> list[float] | None:
    """A linear sweep axis's ticks: its distinct values, where there are at most `most` and none
    crowds the next (C = 1 and 2.5: ticks 1 and 2.5, not 1.2 .. 2.4); None: the axis's own ticks."""
    ticks = sorted({float(v) for v in values})
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    return None if len(ticks) > most or (gaps and min(gaps) < (ticks[-1] - ticks[0]) / 25) else ticks


def histogram_of(values: np.ndarray, title: str, xlabel: str, note: str = "", bins: int = 60) -> Histogram | None:
    """A histogram spec of the finite values (None where there are none: nothing to draw), its
    count axis on a log scale only where the counts span more than two decades (log_counts)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    lo, hi = float(values.min()), float(values.max())
    counts, edges = np.histogram(values, bins=bins, range=(lo, hi if hi > lo else lo + 1))
    return Histogram(counts, edges, title, xlabel, note, log=log_counts(counts))


def log_counts(counts: np.ndarray, decades: float = 2.0) -> bool:
    """Whether a histogram's counts need a log axis: the largest over the smallest non-zero count is
    more than 10**decades (counts of 1 to 7 read better on a linear axis)."""
    c = np.asarray(counts, dtype=np.float64)
    c = c[c > 0]
    return bool(c.size) and float(c.max()) > 10 ** decades * float(c.min())


def value_label(role: str) -> str:
    """A capture's value axis: `output value`, and `value` (never `value value`) for a role that is one."""
    role = str(role)
    return role if role == "value" or role.endswith((" value", "_value", ".value")) else f"{role} value"


def run_label(run: Any) -> str:
    """The run as titles name it: its folder and file, then its run_note (analysis/run_notes.py)."""
    note = run_note(run)
    return f"{run.path.parent.name}/{run.path.name}" + (f" · {note}" if note else "")
