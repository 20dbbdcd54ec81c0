"""plot's figures of samples: maps over their pictures in one row (MapRow) and per-sample curves
with their spread (Bands), from the specs of analysis/report/figure_specs.py; `render` draws any spec.

    fig = render(spec)        # a Heatmap, Lines, Scatter, MapRow, Bands or Circuit spec -> a matplotlib figure
    save(fig, Path("figures/maps.png"))

A map row's maps are drawn as its spec says: signed maps on the diverging scale centred on zero per
sample over the picture in grey, maps in [0, 1] on the sequential scale over the picture in colour;
`with_pictures` gives a spec without pictures the items of a data set the user named (`--data`),
the maps resized to them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hookrun.analysis.images import MIN_MAX, as_pictures, fit_maps, guessed
from hookrun.analysis.report.colour_scales import diverging_range
from hookrun.analysis.report.figure_specs import (
    NO_VALUE,
    SEQUENTIAL,
    Bands,
    Circuit,
    Heatmap,
    Lines,
    MapRow,
)
from hookrun.cli import figures
from hookrun.cli.circuit_figure import circuit
from hookrun.cli.scatter_figure import scatter
from hookrun.config.differing import flatten
from hookrun.errors import ConfigError, NotFoundError


def map_row(spec: MapRow) -> Any:
    """The spec's maps side by side, each captioned, one colour bar."""
    pictures, maps = spec.pictures, np.asarray(spec.maps, dtype=np.float64)

    def signed(ax: Any, k: int) -> Any:
        m = max(diverging_range(maps[k])[1], 1e-12)  # centred on zero: -m .. m, m of the finite values
        if pictures is not None:
            ax.imshow(pictures[k].mean(-1), cmap="gray")
        ax.set_title(spec.captions[k], fontsize=9)
        heat = ax.imshow(maps[k] / m, cmap=figures.diverging_cmap(), vmin=-1, vmax=1, alpha=0.6 if pictures is not None else 1.0,
                         aspect="auto" if maps[k].shape[0] == 1 else "equal")
        return no_value(ax, maps[k], heat)

    def scaled(ax: Any, k: int) -> Any:
        if pictures is not None:
            ax.imshow(pictures[k])
        ax.set_title(spec.captions[k], fontsize=10)
        return no_value(ax, maps[k], ax.imshow(maps[k], cmap=SEQUENTIAL, vmin=0, vmax=1, **({"alpha": 0.5} if pictures is not None else {})))

    title = spec.title + (spec.no_pictures if pictures is None else "")
    fig = figures.image_row(len(maps), signed if spec.signed else scaled, title, spec.label)
    if spec.xlabel:  # (a token model's maps: position k is the map's column k)
        from matplotlib.ticker import MaxNLocator

        for ax in fig.axes[: len(maps)]:
            ax.set_xlabel(spec.xlabel)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def no_value(ax: Any, m: np.ndarray, heat: Any) -> Any:
    """Paint a map's NaN and inf cells NO_VALUE (grey, opaque, over any picture: imshow leaves them
    transparent), as the report does; `heat` (the map's image, its colour bar's) is returned."""
    bad = ~np.isfinite(m)
    if bad.any():
        from matplotlib.colors import ListedColormap

        ax.imshow(np.ma.masked_where(~bad, np.zeros(m.shape)), cmap=ListedColormap([NO_VALUE]), vmin=0, vmax=1,
                  extent=heat.get_extent(), aspect=ax.get_aspect(), interpolation="nearest")
    return heat


def bands(spec: Bands) -> Any:
    """One panel per curve: every sample's curve, the middle half as a band, the mean, the reference dashed."""
    plt = figures.pyplot()
    n = len(spec.panels)
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 3.6), squeeze=False, layout="constrained")
    for ax, band in zip(axes[0], spec.panels, strict=True):
        rows = np.asarray(band.rows, dtype=np.float64)
        for row in rows:
            ax.plot(band.x, row, color="#999999", alpha=0.3, linewidth=0.8)
        ax.fill_between(band.x, np.quantile(rows, 0.25, axis=0), np.quantile(rows, 0.75, axis=0), color=band.colour,
                        alpha=0.2, linewidth=0, label="middle half of the samples")
        ax.plot(band.x, rows.mean(0), color=band.colour, linewidth=2, label=band.mean_label)
        if band.reference is not None:
            ax.plot(band.x, band.reference, color="#333333", linewidth=1.6, linestyle="--", label=band.reference_label)
        ax.set_xlabel(band.xlabel)
        ax.set_ylabel(band.ylabel)
        if band.ylim is not None:
            ax.set_ylim(*band.ylim)
        ax.set_title(band.title)
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(spec.title)
    return fig


def render(spec: Any) -> Any:
    """The matplotlib figure of any figure spec."""
    draw: Callable[[Any], Any] = (figures.lines if isinstance(spec, Lines) else figures.heatmap if isinstance(spec, Heatmap)
                                  else map_row if isinstance(spec, MapRow) else bands if isinstance(spec, Bands)
                                  else circuit if isinstance(spec, Circuit) else scatter)
    return draw(spec)


def with_pictures(spec: Any, dataset: object | None) -> Any:
    """A MapRow without pictures, given the data set's items at its samples (the maps resized to them)."""
    if not isinstance(spec, MapRow) or spec.pictures is not None or dataset is None:
        return spec
    from hookrun.data import normalization

    items, norm = np.stack([item_input(dataset, int(i)) for i in spec.indices]), normalization(dataset)
    pictures = as_pictures(items, norm)
    spec.title += f" · {MIN_MAX}" if guessed(items, norm) else ""
    spec.maps, spec.pictures = fit_maps(np.asarray(spec.maps, dtype=np.float64), pictures[0].shape[:2]), pictures
    return spec


def check_covers(dataset: object, samples: np.ndarray) -> None:
    """--data must hold every sample the run read: its indices are the run's (before any drawing)."""
    n = len(dataset) if hasattr(dataset, "__len__") else None  # type: ignore[arg-type]
    top = int(np.max(samples)) if len(samples) else -1
    if n is not None and top >= n:
        raise NotFoundError(f"--data: the run's samples go up to index {top}, past the {n} items of the data set named; "
                            f"name the data set the run read (python -m hookrun.inspect shows the run's config)")


def check_same_data(dataset: object, run: Any, named: dict) -> str:
    """--data must be the data set the run read: its items' labels at the run's samples are the file's
    /samples/target (a mismatch: ConfigError naming the first sample that differs, before any drawing;
    at most CHECKED samples, spread evenly over the run, are read: a long run's data set is not loaded whole).
    Where the file has no targets, the data config named (`named`: data.dataset, data.root) is compared
    with the run's recorded one: the line returned warns of each key that differs ("" where none)."""
    if run.targets is not None and np.ndim(run.targets) == 1:
        for i, target in checked(np.asarray(run.samples), np.asarray(run.targets)):
            item = dataset[int(i)]  # type: ignore[index]
            label = np.asarray(item[1]) if isinstance(item, tuple | list) and len(item) > 1 else None  # (a tensor's too)
            if label is not None and label.size == 1 and label.dtype.kind in "iub" and int(label) != int(target):
                raise ConfigError(f"--data: item {int(i)} of the data set named has label {int(label)}, but the run's sample "
                                  f"{int(i)} had target {int(target)}: it is not the data set the run read; name that one "
                                  f"(python -m hookrun.inspect shows the run's config)")
        return ""
    recorded = (run.config or {}).get("data") or {}
    mine, theirs = (flatten({"dataset": d.get("dataset"), "root": d.get("root")}) for d in (named, recorded))
    differ = [f"data.{k} {mine.get(k)!r} (the run's {theirs.get(k)!r})" for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    return (f"warning: --data differs from the run's recorded data config at {', '.join(differ)}; the file has no targets "
            f"to check its items against: the pictures may not be the run's samples") if differ and recorded else ""


CHECKED = 256  # the samples check_same_data reads at most (evenly spread, the first and the last among them)


def checked(samples: np.ndarray, targets: np.ndarray) -> zip:
    """The (sample, target) pairs check_same_data reads: every one up to CHECKED, else CHECKED evenly spread."""
    keep = np.unique(np.linspace(0, len(samples) - 1, CHECKED).round().astype(int)) if len(samples) > CHECKED else slice(None)
    return zip(samples[keep], targets[keep], strict=True)


def item_input(dataset: object, i: int) -> np.ndarray:
    try:
        item = dataset[i]  # type: ignore[index]
    except IndexError:
        raise NotFoundError(f"--data: the data set named has no item {i}, a sample of the run; name the data set "
                            f"the run read") from None
    x = item[0] if isinstance(item, tuple | list) else item
    x = x.detach().float().numpy()
    if x.ndim != 3 or x.shape[0] not in (1, 3):
        raise NotFoundError(f"--data: item {i} is a {tuple(x.shape)} tensor, not an image (channels 1 or 3, H, W)")
    return x
