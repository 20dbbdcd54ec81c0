"""What readers show of a patching run, from its file alone: the grids as labelled arrays, an edges
run's top edges, inspect's lines and the report's header rows; registered below as patching's reader
(analysis/kind_readers.py), so `open_run`, inspect, plot and report ask the file's kind.

    run = open_run("outputs/.../captures.h5")
    run.grids                    # ["resid", "heads"]: the grids the file holds (from its root attributes)
    run.grid("heads")            # xarray.DataArray, dims ("module", "position", "head")
    top, grid = run.edges(top=20)   # an edges run: Table(writer, reader, score); DataArray (writer, reader)

A run's grids are its rows (one per cell, /samples/index the cell number) placed at their cells by
the layout of its root attribute `patching` (JSON: cells.py's Layout.describe(), the metric, the
method, an edges run's graph, node scores and faithfulness curve; docs/format.md); cells not
written (an unfinished run) are NaN. `labels` (`p:TEXT`, token text) names the `position` axis where known.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hookrun.analysis.kind_readers import KindReader, Table, register_reader
from hookrun.error_words import json_attribute
from hookrun.errors import ConfigError, HookrunError, NotFoundError
from hookrun.text_labels import token_label

ATTRS = ("metric", "method", "direction", "metric_clean", "metric_corrupt", "normalize")
CELL_UNITS = ("chunks of cells", "cells")  # a step is one chunk of cells; a row is a cell


def patching_meta(attrs: Any) -> dict | None:
    """A run's `patching` root attribute (JSON), from its root attributes (an h5py file's `attrs`, or
    an object-store run's manifest), or None where the run was no patching run."""
    return json_attribute(attrs, "patching")


def first_dim(g: Mapping[str, Any]) -> str:
    """The name of a grid's first axis: `writer` for an edges run's [writer, reader] grid (its layout
    says so; a file written before it did: the grid over `reader` alone), `module` for a site's grid."""
    return "writer" if list(g.get("dims") or []) == ["writer", "reader"] or list(g.get("over") or []) == ["reader"] else "module"


def as_grid(name: str, values: np.ndarray, layout: Mapping[str, Any], attrs: Mapping[str, Any],
            labels: list[str] | None = None) -> Any:
    """Grid `name` as a DataArray, dims ("module", *over) (an edges grid: ("writer", "reader"), its
    readers named as the graph in `attrs` names them), from every cell's value `values`."""
    try:
        import xarray as xr  # (imported here: hookrun imports without it)
    except ModuleNotFoundError:
        raise HookrunError(f"the patching grid {name!r} is a labelled array and needs xarray: pip install 'hookrun[xarray]'") from None

    if name not in layout:
        raise NotFoundError(f"no patching grid {name!r}; the grids: {', '.join(layout) or 'none'}")
    g = layout[name]
    shape = (len(g["modules"]), *g["sizes"])
    n = int(np.prod(shape))
    data = np.asarray(values[g["offset"]: g["offset"] + n], dtype=np.float64)
    if len(data) < n:  # an unfinished run: the cells not yet written are NaN
        data = np.concatenate([data, np.full(n - len(data), np.nan)])
    first = first_dim(g)
    coords: dict[str, Any] = {first: list(g["modules"])}
    readers = (attrs.get("graph") or {}).get("readers") if first == "writer" else None
    for axis, size in zip(g["over"], g["sizes"], strict=True):
        coords[axis] = list(labels) if axis == "position" and labels is not None and len(labels) == size else np.arange(size)
        if axis == "reader" and readers is not None and len(readers) == size:
            coords[axis] = list(readers)
    return xr.DataArray(data.reshape(shape), dims=(first, *g["over"]), coords=coords, name=name,
                        attrs={k: attrs[k] for k in ATTRS if k in attrs})


def file_grid(file: Any, name: str, which: str = "value") -> Any:
    """run.grid(name, which): a patching grid as an xarray.DataArray, dims ("module", *over) (an
    edges run's: ("writer", "reader"));
    `which="exact"`: an atp run's exactly recomputed cells (verify: K), NaN elsewhere. docs/patching.md."""
    meta = patching_meta(file.attrs)
    if meta is None:
        raise NotFoundError(f"no patching grid {name!r}: {file.filename} is not a patching run (it has no grids)")
    if which not in ("value", "exact"):
        raise NotFoundError(f"which={which!r}; choose value or exact")
    values = np.full(int(meta["cells"]), np.nan)
    path = f"captures/patching/cells/{which}"
    if path in file:
        rows = file[path][:]
        values[file["samples/index"][: len(rows)]] = rows
    return as_grid(name, values, meta["layout"], meta, shown_labels(meta.get("labels")))


def shown_labels(labels: list[str] | None) -> list[str] | None:
    """The file's position labels, each naming its position: as written (`p:TEXT`, `[p]`), and a
    file written before they did (the bare token text: '' for a BOS, ' ' for a space) as `p:TEXT`
    with its text made visible, so no column is blank or named like another."""
    if labels is None:
        return None
    return [s if s == f"[{p}]" or s.startswith(f"{p}:") else f"{p}:{token_label(s)}" for p, s in enumerate(map(str, labels))]


def grid_names(attrs: Any) -> list[str]:
    """run.grids: the patching grids the file holds, by site name ([] for a run that patched nothing;
    an object-store run's from its manifest: nothing fetched)."""
    meta = patching_meta(attrs)
    return list(meta["layout"]) if meta is not None else []


def grid_lines(attrs: Any) -> list[str]:
    """inspect's lines for a patching run's grids (from the root attributes alone)."""
    meta = patching_meta(attrs)
    if meta is None:
        return []
    lines = [f"  grids     {meta['method']} {meta['direction']} patching, metric {meta['metric']} (clean "
             f"{meta['metric_clean']:.4g}, corrupt {meta['metric_corrupt']:.4g}){', normalized' if meta['normalize'] else ''}"]
    for name, g in meta["layout"].items():
        shape = " x ".join(f"{a} {n}" for a, n in zip((first_dim(g), *g["over"]), (len(g["modules"]), *g["sizes"]), strict=True))
        graph = meta.get("graph") if "reader" in g.get("dims", ()) else None
        other = len(g["modules"]) * int(np.prod(g["sizes"])) - graph["edges"] if graph and "edges" in graph else 0
        lines.append(f"    {name:12s}{shape}" + (f": {graph['edges']} edges; the other {other} cells (a writer at or after its "
                                                 "reader) are no edge and hold NaN" if other else ""))
    return lines + faithfulness_lines(meta.get("faithfulness"))


def faithfulness_lines(curve: Mapping[str, Any] | None) -> list[str]:
    """An edges run's recovered fractions: per circuit size k, and MIB's CPR / CMD curves (edges/mib.py)."""
    if not curve:
        return []
    out = []
    if curve.get("k"):
        pairs = ", ".join(f"{k}: {r:.3g}" for k, r in zip(curve["k"], curve["recovered"], strict=True))
        out.append(f"    faithfulness {curve.get('ablation', 'corrupt')} ablation, from {curve.get('from', '?')}: recovered at k edges {pairs}")
    mib = curve.get("mib")
    if mib:
        out.append(f"    MIB          CPR {mib['cpr']['area']:.4g}, CMD {mib['cmd']['area']:.4g} over fractions of {mib['n_edges']} edges")
        if mib.get("undefined"):
            return [*out, f"      undefined: {mib['undefined']}"]
        for name in ("cpr", "cmd"):
            pairs = ", ".join(f"{f:g}: {v:.3g}" for f, v in zip(mib["fractions"], mib[name]["faithfulness"], strict=True))
            out.append(f"      {name} ({'signed' if name == 'cpr' else '|score|'}) faithfulness {pairs}")
    return out


def header_rows(attrs: Any) -> list[list[str]]:
    """The report's run table: how the run patched, and each grid's shape."""
    lines = grid_lines(attrs)
    if not lines:
        return []
    meta = patching_meta(attrs)
    grids = lines[1: 1 + len(meta["layout"])]
    faith = [line.split(None, 1) for line in faithfulness_lines(meta.get("faithfulness"))]
    return [["patching", lines[0].split("grids", 1)[1].strip()],
            *([f"grid {line.split()[0]}", " ".join(line.split()[1:])] for line in grids),
            *([name, rest] for name, rest in faith)]


# -- an edges run (patching method eap / eap_ig, docs/edges.md): its grid `edges` is [writer, reader],
# NaN where the writer does not feed the reader; its graph, node scores and faithfulness curve are in
# the `patching` attribute.
def edge_values(file: Any) -> tuple[np.ndarray, dict]:
    """The [writers, readers] scores of an edges run's file and its `patching` meta."""
    meta = patching_meta(file.attrs)
    if meta is None or "edges" not in meta.get("layout", {}) or "graph" not in meta:
        raise NotFoundError(f"{getattr(file, 'filename', file)} holds no edge grid: run patching with method eap or eap_ig")
    if meta.get("grid_complete") is False:  # a bounded run writes its grid as it goes (edges/bounded.py)
        raise NotFoundError(f"{getattr(file, 'filename', file)} holds part of an edge grid ({_rows(file)} of {meta['cells']} "
                          f"cells): the run stopped before its last reader group; resume it (resume=true)")
    rows, cells = _rows(file), int(meta["cells"])
    if rows < cells:  # (a view whose shard is missing: its rank failed before it wrote a cell)
        shards = file.attrs.get("incomplete_shards")
        raise NotFoundError(f"{getattr(file, 'filename', file)} holds {rows} of {cells} cells of its edge grid (status "
                            f"{file.attrs.get('status', '?')}{f': {shards}' if shards else ''}): the run did not finish; "
                            f"run the same command with resume=true to finish it")
    return np.asarray(file_grid(file, "edges").values, dtype=np.float64), meta


def _rows(file: Any) -> int:
    path = "captures/patching/cells/value"
    return int(file[path].shape[0]) if path in file else 0


def top_table(writers: list[str], readers: list[str], scores: np.ndarray, top: int) -> Table:
    flat = np.where(np.isnan(scores), -1.0, np.abs(scores)).reshape(-1)
    order = [i for i in np.argsort(-flat, kind="stable")[:top] if flat[i] >= 0]
    rows = [{"writer": writers[i // len(readers)], "reader": readers[i % len(readers)],
             "score": float(scores.reshape(-1)[i])} for i in order]
    return Table(["writer", "reader", "score"], rows)


def edge_grid(scores: np.ndarray, meta: dict) -> Any:
    """The [writer, reader] grid as an xarray.DataArray; `meta`: the run's `patching` attribute."""
    import xarray as xr  # (imported here: hookrun imports without it)

    g = meta["graph"]
    grid = xr.DataArray(scores, dims=("writer", "reader"), coords={"writer": g["writers"], "reader": g["readers"]},
                        name="edges", attrs={k: meta[k] for k in ("metric", "method", "metric_clean", "metric_corrupt",
                                                                   "ig_steps") if k in meta})
    grid.attrs["node_scores"] = meta.get("node_scores")
    grid.attrs["node_scores_by_position"] = meta.get("node_scores_by_position")  # [writer][position]
    if meta.get("faithfulness"):
        grid.attrs["faithfulness_k"] = meta["faithfulness"]["k"]
        grid.attrs["faithfulness_recovered"] = meta["faithfulness"]["recovered"]
        mib = meta["faithfulness"].get("mib")
        if mib:  # MIB's circuits at fractions of the edges (docs/edges.md)
            grid.attrs["faithfulness_fractions"] = mib["fractions"]
            grid.attrs["faithfulness_cpr"], grid.attrs["faithfulness_cmd"] = mib["cpr"]["area"], mib["cmd"]["area"]
            grid.attrs["faithfulness_cpr_curve"] = mib["cpr"]["faithfulness"]
            grid.attrs["faithfulness_cmd_curve"] = mib["cmd"]["faithfulness"]
            if mib.get("undefined"):
                grid.attrs["faithfulness_undefined"] = mib["undefined"]
    return grid


def file_edges(file: Any, top: int = 20) -> tuple[Table, Any]:
    """run.edges(top): an edges run's top edges by |score| as a Table (writer, reader, score) and its
    [writer, reader] grid as an xarray.DataArray (node scores and the faithfulness curve in its
    attrs). docs/edges.md."""
    import numbers

    if top is not None and (isinstance(top, bool) or not isinstance(top, numbers.Integral) or top < 0):
        raise ConfigError(f"run.edges(top={top!r}): give how many edges to list (a whole number >= 0), or None for all")
    scores, meta = edge_values(file)
    g = meta["graph"]
    return top_table(g["writers"], g["readers"], scores, top), edge_grid(scores, meta)


def _figures(run: Any) -> list[tuple[str, Any]]:
    from hookrun.runner.kinds.patching.report import plot_figures

    return plot_figures(run)


def _sections(run: Any) -> list[dict]:
    from hookrun.runner.kinds.patching.report import sections

    return sections(run)


def _columns(f: Any) -> dict[str, Any]:
    """A sweep table's numbers of an edges run with a faithfulness curve: the fraction of the gap
    recovered at each circuit size (`recovered@K`) and MIB's areas (`CPR`, `CMD`), so a sweep of the
    faithfulness settings (`ablation: corrupt,mean`) is told apart by its results, not by its grid alone."""
    curve = (patching_meta(f.attrs) or {}).get("faithfulness") or {}
    out: dict[str, Any] = {f"recovered@{k}": r for k, r in zip(curve.get("k") or [], curve.get("recovered") or [], strict=False)}
    if curve.get("mib"):
        out.update(CPR=curve["mib"]["cpr"]["area"], CMD=curve["mib"]["cmd"]["area"])
    return out


def _no_values(label: str) -> str | None:
    if label == "patching/cells/exact":
        return "no values: nothing recomputed (an exact run's cells are in patching/cells/value; atp fills this with verify)"
    return None


READER = register_reader(KindReader(
    "patching", present=lambda f: patching_meta(f.attrs) is not None, units=CELL_UNITS, attr_lines=grid_lines,
    header=header_rows, properties={"grids": grid_names}, methods={"grid": file_grid, "edges": file_edges},
    sections=_sections, figures=_figures, no_values=_no_values, columns=_columns))
