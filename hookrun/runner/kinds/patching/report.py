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

from hookrun.analysis.report.figure_specs import Circuit, Heatmap, Lines, Scatter
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
    per plane, titled `site · method · metric` (the method from the file's patching attribute) and
    coloured around the unpatched run's metric (the corrupted run's when denoising, the clean
    run's when noising, 0 when normalised), and where exact values were recomputed (atp with
    verify), the estimate against them. An exact run has no estimate to compare: no scatter."""
    out = []
    for name in list(getattr(run, "grids", None) or []):  # (asked of the kind registry: reader.py)
        g = run.grid(name)
        a = dict(g.attrs)
        about = ", ".join(f"{k} {_short(a[k])}" for k in ("metric", "method", "direction", "metric_clean", "metric_corrupt", "normalize") if k in a)
        base = 0.0 if a.get("normalize") else a.get("metric_clean" if a.get("direction") == "noise" else "metric_corrupt")
        specs: list[Any] = [Heatmap(z, grid_title(name, a, title), x=x, y=[str(m) for m in g.coords["module"].values], xlabel=xlabel,
                                    ylabel="module", label=metric_label(a), centre=_float(base))
                            for title, z, x, xlabel in _planes(g)]
        exact = _exact(run, name) if a.get("method", "exact") != "exact" else None
        if exact is not None:
            est, ex = np.asarray(g.values, dtype=np.float64).ravel(), np.asarray(exact.values, dtype=np.float64).ravel()
            done = np.isfinite(ex)
            labels = [", ".join(f"{d} {g.coords[d].values[i]}" for d, i in zip(g.dims, idx, strict=True))
                      for idx in zip(*np.unravel_index(np.flatnonzero(done), g.shape), strict=True)]
            if done.any():
                specs.append(Scatter(est[done], ex[done], f"estimate ({a.get('method', 'atp')}), {metric_label(a)}", "exact",
                                     f"{name}: {a.get('method', 'atp')} estimate against exact patching ({int(done.sum())} cells recomputed)",
                                     labels))
        specs += [_circuit(run, g), *_faithfulness(run)] if name == "edges" and "reader" in g.dims else []
        out.append((name, about, specs))
    return out


def grid_file_name(spec: Any, attrs: Any) -> str:
    """A grid picture's file stem: `grid_SITE_METHOD_METRIC` (two methods' pictures never share a name)."""
    site = " · ".join(spec.title.split(" · ")[:-2]) if isinstance(spec, Heatmap) else spec.title.split(":")[0]
    what = "" if isinstance(spec, Heatmap) else "_estimate_vs_exact"
    normalised = "_normalised" if "normalised" in metric_label(attrs) else ""
    return f"grid_{site}_{attrs.get('method', 'exact')}_{attrs.get('metric', 'value')}{normalised}{what}"


def plot_figures(run: Any) -> list[tuple[str, Any]]:
    """plot's pictures: each grid's heatmaps and estimate-vs-exact scatter (`grid_SITE_METHOD_METRIC`)
    and an edges run's faithfulness curve (`curve_...`); the circuit drawing is the report's."""
    out = []
    for name, _, specs in grid_specs(run):
        attrs = dict(run.grid(name).attrs)
        for spec in specs:
            if isinstance(spec, Lines):
                out.append((f"curve_{spec.title}", spec))
            elif isinstance(spec, Heatmap | Scatter):
                out.append((grid_file_name(spec, attrs), spec))
    return out


def sections(run: Any) -> list[dict]:
    items = [{"type": "figures", "title": f"{name}: {about}", "figures": [figure(s) for s in specs]}
             for name, about, specs in grid_specs(run)]
    return [section("grids", "Patching and attribution grids", items)] if items else []


def _exact(run: Any, name: str) -> Any:
    try:
        return run.grid(name, "exact")
    except (LookupError, KeyError, ValueError):
        return None


def _planes(g: Any) -> list[tuple[str, np.ndarray, list[str] | None, str]]:
    """(title suffix, module x axis values, axis labels, axis name) for each 2-D plane of a grid:
    the second axis across, one plane per index of the axes after it (at most 16)."""
    values = np.asarray(g.values, dtype=np.float64)
    if values.ndim == 1:
        return [("", values[:, None], None, "")]
    dim = g.dims[1]
    x = [str(v) for v in g.coords[dim].values] if dim in g.coords else None
    rest = values.shape[2:]
    planes = []
    for k, idx in enumerate(np.ndindex(*rest)):
        if k >= 16:
            break
        title = "".join(f" · {d} {g.coords[d].values[i] if d in g.coords else i}" for d, i in zip(g.dims[2:], idx, strict=True))
        planes.append((title, values[(slice(None), slice(None), *idx)], x, dim))
    return planes


def _circuit(run: Any, g: Any, top: int = 30) -> Circuit:
    """The `top` edges of an edges run's [writer, reader] grid (dims module, reader) as a circuit: a node per
    component (a head's q/k/v readers are its node), embed at the bottom, each layer's heads then its MLP
    above, logits at the top."""
    graph = _meta(run).get("graph") or {}
    writers, readers = graph.get("writers") or [], graph.get("readers") or []
    values = np.asarray(g.values, dtype=np.float64)
    node = lambda label: label.rsplit(".", 1)[0] if label.count(".") == 2 else label  # noqa: E731 (L0.H1.q -> L0.H1)
    names = list(dict.fromkeys([*map(node, writers), *map(node, readers)]))
    layers = 1 + max([int(n.split(".")[0][1:]) for n in names if n[0] == "L"] or [0])
    heads = 1 + max([int(n.split(".")[1][1:]) for n in names if ".H" in n] or [0])
    x, y = [], []
    for n in names:
        if n in ("embed", "logits"):
            x.append((heads - 1) / 2)
            y.append(0.0 if n == "embed" else 2.0 * layers + 1)
            continue
        layer, part = n.split(".")
        x.append(float(part[1:]) if part[0] == "H" else -1.0)
        y.append(2.0 * int(layer[1:]) + (1 if part[0] == "H" else 2))
    flat = np.where(np.isfinite(values), np.abs(values), -1.0).ravel()
    index = {n: i for i, n in enumerate(names)}
    edges = []
    for f in np.argsort(-flat, kind="stable")[:top]:
        if flat[f] < 0:
            break
        w, r = writers[f // len(readers)], readers[f % len(readers)]
        edges.append((index[node(w)], index[node(r)], float(values.ravel()[f]), f"{w} -> {r}"))
    return Circuit(names, x, y, edges[::-1], f"circuit: the top {len(edges)} edges by |score|")


def _faithfulness(run: Any) -> list[Any]:
    """An edges run's faithfulness curve (docs/edges.md): the recovered fraction against the edges kept."""
    curve = _meta(run).get("faithfulness")
    if not curve:
        return []
    out = []
    if curve.get("k"):
        out.append(Lines(curve["k"], {"recovered": curve["recovered"]}, "edges kept (top k by |score|)", "recovered fraction",
                         f"faithfulness: {curve.get('ablation', 'corrupt')} ablation outside the top-k edges of {curve.get('from', '')}"))
    mib = curve.get("mib")
    if mib:  # MIB's circuits at fractions of the edges (edges/mib.py): CPR from the signed ranking, CMD from |score|
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
