"""A patching run's pictures, for the report and plot: a module x axis heatmap per grid plane, an
atp estimate against the exact cells recomputed (verify), and an edges run's circuit and
faithfulness curve. Built from the figure specs shared by report and plot (analysis/report/figure_specs.py).

    sections(run)       # the report's "grids" section ([] where the file holds no grid)
    plot_figures(run)   # plot's pictures: (file stem, spec)
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from hookrun.analysis.report.figure_specs import (
    Circuit,
    Heatmap,
    Lines,
    NotShown,
    Scatter,
    no_information,
)
from hookrun.analysis.report.run_sections import figure, section

METHODS = {"exact": "exact patching", "atp": "attribution patching (atp)", "atp_ig": "atp with integrated gradients (atp_ig)",
           "eap": "edge attribution patching (eap)", "eap_ig": "eap with integrated gradients (eap_ig)"}


def metric_label(attrs: Any) -> str:
    """A grid's colour bar: its metric, and 'normalised' where the values are (0 corrupt, 1 clean)."""
    normalised = bool(attrs.get("normalize")) and str(attrs.get("normalize")).lower() not in ("false", "0", "no")
    return f"{attrs.get('metric', 'value')}" + (" (normalised)" if normalised else "")


def grid_title(name: str, attrs: Any, plane: str = "") -> str:
    """`site · method · metric`: what was patched, how, and what the colours measure."""
    method = str(attrs.get("method", "exact"))
    return f"{name}{plane} · {METHODS.get(method, method)} · {metric_label(attrs)}"


def grid_specs(run: Any) -> list[tuple[str, str, list[Any]]]:
    """(grid name, what it measured, specs) of every grid the file holds: a module x axis heatmap
    per plane (an edges grid: writer x reader, both named), titled `site · method · metric` (the
    method from the file's patching attribute) and coloured on the diverging scale centred on the
    value that means "no effect" (no_effect), and where exact values were recomputed (atp with
    verify), the estimate against them. An exact run has no estimate to compare: no scatter."""
    out = []
    for name in list(getattr(run, "grids", None) or []):  # (asked of the kind registry: reader.py)
        g = run.grid(name)
        a = dict(g.attrs)
        about = ", ".join(f"{k} {_short(a[k])}" for k in ("metric", "method", "direction", "metric_clean", "metric_corrupt", "normalize") if k in a)
        undefined = ((_meta(run).get("faithfulness") or {}).get("mib") or {}).get("undefined") if name == "edges" else None
        about += f"; MIB faithfulness: {undefined}" if undefined else ""  # (its curve, all NaN, is not drawn)
        first = g.dims[0]  # module (a site's grid) or writer (an edges grid)
        specs: list[Any] = [Heatmap(z, grid_title(name, a, title) + more, x=x, y=[str(m) for m in g.coords[first].values],
                                    xlabel=xlabel, ylabel=first, label=_colour_label(a, first), centre=no_effect(a, first))
                            for title, z, x, xlabel, more in _planes(g)]
        exact = _exact(run, name) if a.get("method", "exact") != "exact" else None
        if exact is not None:
            est, ex = np.asarray(g.values, dtype=np.float64).ravel(), np.asarray(exact.values, dtype=np.float64).ravel()
            done = np.isfinite(ex)
            labels = [", ".join(f"{d} {g.coords[d].values[i]}" for d, i in zip(g.dims, idx, strict=True))
                      for idx in zip(*np.unravel_index(np.flatnonzero(done), g.shape), strict=True)]
            if done.any():
                specs.append(Scatter(est[done], ex[done], f"estimate ({a.get('method', 'atp')}), {metric_label(a)}", "exact",
                                     f"{name}: {a.get('method', 'atp')} estimate against exact patching ({int(done.sum())} cells recomputed)",
                                     labels, diagonal=True, points="cells"))
        specs += [_circuit(run, g), *_faithfulness(run)] if name == "edges" and "reader" in g.dims else []
        out.append((name, about, specs))
    return out


def no_effect(attrs: Any, first: str = "module") -> float | None:
    """The value a grid's cell takes where patching changes nothing, the centre of its diverging
    scale: 0 for an edges grid (a score is an estimated change of the metric); for a site's grid
    (exact: the metric of the patched run; atp, atp_ig: the unpatched run's metric plus the
    estimated change) the unpatched run's metric: the corrupted run's when denoising, the clean
    run's when noising, and normalised, 0 when denoising, 1 when noising."""
    if first == "writer":
        return 0.0
    noise = attrs.get("direction") == "noise"
    if attrs.get("normalize"):
        return 1.0 if noise else 0.0
    return _float(attrs.get("metric_clean" if noise else "metric_corrupt"))


def _colour_label(attrs: Any, first: str) -> str:
    """The colour bar: an edge's score is a change of the metric, a cell's value the metric itself."""
    return f"change of {metric_label(attrs)} (edge score)" if first == "writer" else metric_label(attrs)


def grid_file_name(spec: Any, attrs: Any) -> str:
    """A grid picture's file stem: `grid_SITE_METHOD_METRIC` (two methods' pictures never share a name)."""
    site = " · ".join(spec.title.split(" · ")[:-2]) if isinstance(spec, Heatmap) else spec.title.split(":")[0]
    what = "" if isinstance(spec, Heatmap) else "_estimate_vs_exact"
    normalised = "_normalised" if "normalised" in metric_label(attrs) else ""
    return f"grid_{site}_{attrs.get('method', 'exact')}_{attrs.get('metric', 'value')}{normalised}{what}"


def plot_figures(run: Any) -> list[tuple[str, Any]]:
    """plot's pictures: each grid's heatmaps and estimate-vs-exact scatter (`grid_SITE_METHOD_METRIC`)
    and an edges run's faithfulness curve (`curve_...`) and circuit (`circuit_METHOD_METRIC`)."""
    out = []
    for name, _, specs in grid_specs(run):
        attrs = dict(run.grid(name).attrs)
        for spec in specs:
            if isinstance(spec, NotShown):
                out.append(("curve_mib", spec))
            elif isinstance(spec, Lines):
                out.append((f"curve_{spec.title}", spec))
            elif isinstance(spec, Heatmap | Scatter):
                out.append((grid_file_name(spec, attrs), spec))
            elif isinstance(spec, Circuit):
                out.append((f"circuit_{attrs.get('method', 'edges')}_{attrs.get('metric', 'value')}", spec))
    return out


def sections(run: Any) -> list[dict]:
    """The report's grids; a plane none of whose cells has a value (a run that failed before them) is
    not drawn, and the section's note names it."""
    items, empty = [], []
    for name, about, specs in grid_specs(run):
        specs = [s for s in specs if not isinstance(s, NotShown)]  # (its reason is in the grid's title: `about`)
        shown = [s for s in specs if not no_information(s)]
        if len(shown) < len(specs):
            empty.append(name if not shown else f"{len(specs) - len(shown)} of {name}'s planes")
        if shown:
            items.append({"type": "figures", "title": f"{name}: {about}", "figures": [figure(s) for s in shown]})
    note = f"Not drawn: {', '.join(empty)}: no cell has a value (NaN: not computed, or not finite)." if empty else ""
    return [section("grids", "Patching and attribution grids", items, note)] if items else []


def _exact(run: Any, name: str) -> Any:
    try:
        return run.grid(name, "exact")
    except (LookupError, KeyError, ValueError):
        return None


PLANES = 16  # heatmaps drawn per grid


def _planes(g: Any) -> list[tuple[str, np.ndarray, list[str] | None, str, str]]:
    """(title suffix, module x axis values, axis labels, axis name, note) for each 2-D plane of a grid:
    the second axis across, one plane per index of the axes after it; where that makes more than PLANES
    planes, the longest `over` axis across (over [head, position]: a module x position plane per head,
    so the last positions are never the ones left out), and still more than PLANES: the first PLANES,
    each title saying how many there are."""
    values = np.asarray(g.values, dtype=np.float64)
    if values.ndim == 1:
        return [("", values[:, None], None, "", "")]
    dims = list(g.dims)
    if int(np.prod(values.shape[2:])) > PLANES:
        across = 1 + int(np.argmax(values.shape[1:]))
        order = [0, across, *[i for i in range(1, values.ndim) if i != across]]
        values, dims = values.transpose(order), [dims[i] for i in order]
    dim = dims[1]
    x = [str(v) for v in g.coords[dim].values] if dim in g.coords else None
    rest = values.shape[2:]
    total = int(np.prod(rest))
    more = f" (the first {PLANES} of {total} planes)" if total > PLANES else ""
    planes = []
    for k, idx in enumerate(np.ndindex(*rest)):
        if k >= PLANES:
            break
        title = "".join(f" · {d} {g.coords[d].values[i] if d in g.coords else i}" for d, i in zip(dims[2:], idx, strict=True))
        planes.append((title, values[(slice(None), slice(None), *idx)], x, dim, more))
    return planes


def _circuit(run: Any, g: Any, top: int = 30) -> Circuit:
    """The `top` edges of an edges run's [writer, reader] grid as a circuit, laid out by layer: embed
    at the bottom; each layer a row of its heads' q, k and v readers (side by side under their
    head), a row of its heads (writers) and a row of its MLP (in a column right of the heads);
    logits at the top. Every node of the
    graph is drawn (its short name as its label, its full name on hover); edges are the top ones."""
    graph = _meta(run).get("graph") or {}
    writers, readers = graph.get("writers") or [], graph.get("readers") or []
    values = np.asarray(g.values, dtype=np.float64)
    names = list(dict.fromkeys([*writers, *readers]))
    layers = 1 + max([_layer(n) for n in names if _layer(n) is not None] or [0])
    heads = 1 + max([int(n.split(".")[1][1:]) for n in names if _layer(n) is not None and n.split(".")[1][0] == "H"] or [0])
    mid = (heads - 1) / 2
    x, y, labels = [], [], []
    for k, n in enumerate(names):
        layer, parts = _layer(n), n.split(".")
        if n in ("embed", "logits") or layer is None:
            x.append(mid)
            y.append(0.0 if n == "embed" else 3.0 * layers + 1 if n == "logits" else -1.0 - k)
            labels.append(n)
        elif parts[1][0] == "H" and len(parts) == 3:  # a head's q, k or v reader
            x.append(int(parts[1][1:]) + QKV_OFFSET.get(parts[2], 0.0))
            y.append(3.0 * layer + 1)
            labels.append(parts[2])
        elif parts[1][0] == "H":  # a head (its output: a writer)
            x.append(float(parts[1][1:]))
            y.append(3.0 * layer + 2)
            labels.append(n)
        else:  # the layer's MLP (its input a reader, its output a writer): a column right of the heads
            x.append(heads + 0.4)
            y.append(3.0 * layer + 3)
            labels.append(n)
    flat = np.where(np.isfinite(values), np.abs(values), -1.0).ravel()
    index = {n: i for i, n in enumerate(names)}
    edges = []
    for f in np.argsort(-flat, kind="stable")[:top]:
        if flat[f] < 0:
            break
        w, r = writers[f // len(readers)], readers[f % len(readers)]
        edges.append((index[w], index[r], float(values.ravel()[f]), f"{w} -> {r}"))
    return Circuit(names, x, y, edges[::-1], f"circuit · {g.attrs.get('method', 'edges')} · {metric_label(g.attrs)}: the top {len(edges)} "
                   "edges by |score|", labels)


QKV_OFFSET = {"q": -0.28, "k": 0.0, "v": 0.28}  # a head's three readers, side by side under it


def _layer(name: str) -> int | None:
    head = name.split(".")[0]
    return int(head[1:]) if head[:1] == "L" and head[1:].isdigit() else None


def _faithfulness(run: Any) -> list[Any]:
    """An edges run's faithfulness curve (docs/edges.md): the recovered fraction against the edges kept."""
    curve = _meta(run).get("faithfulness")
    if not curve:
        return []
    out = []
    if curve.get("k"):
        out.append(Lines([float(k) for k in curve["k"]], {"recovered": curve["recovered"]},  # (numbers, not categories at even steps)
                         "edges kept (top k by |score|; log scale, with 0)", "recovered fraction",
                         f"faithfulness: {curve.get('ablation', 'corrupt')} ablation outside the top-k edges of {curve.get('from', '')}",
                         log_x=True))
    mib = curve.get("mib")
    if mib and mib.get("undefined"):  # (plot's `not drawn:` line; the report's grid title says it)
        out.append(NotShown(f"the faithfulness (MIB) curve of {curve.get('from', '')}", mib["undefined"]))
    elif mib:  # MIB's circuits at fractions of the edges (edges/mib.py): CPR from the signed
        # ranking, CMD from |score| (undefined: no curve to draw; the grid's title says why)
        out.append(Lines(mib["fractions"], {"signed ranking (CPR)": mib["cpr"]["faithfulness"],
                                            "|score| ranking (CMD)": mib["cmd"]["faithfulness"]},
                         f"fraction of the {mib['n_edges']} edges kept (pruned as MIB prunes)", "faithfulness",
                         f"faithfulness (MIB) of {curve.get('from', '')}: CPR {mib['cpr']['area']:.3f}, CMD {mib['cmd']['area']:.3f}",
                         log_x=True))
    return out


def _meta(run: Any) -> dict:
    """The run's `patching` root attribute (reader.py's patching_meta, read here without importing it)."""
    return json.loads(run.attrs.get("patching") or "{}")


def _short(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None
