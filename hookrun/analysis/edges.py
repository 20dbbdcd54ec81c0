"""An edges run's grid read back: the top edges as a Table, the [writer, reader] grid as a labelled array.

    top, grid = open_run("edges.h5").edges(top=20)    # Table(writer, reader, score); DataArray (writer, reader)

An edges run (patching method eap / eap_ig, docs/edges.md) stores its grid as the patching grid
`edges` (one row per [writer, reader] cell, NaN where the writer does not feed the reader) and its
graph, node scores and faithfulness curve in the root attribute `patching` (JSON).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hookrun.analysis.grids import file_grid, patching_meta
from hookrun.analysis.kind_readers import KindReader, register_reader
from hookrun.analysis.table import Table


def edge_values(file: Any) -> tuple[np.ndarray, dict]:
    """The [writers, readers] scores of an edges run's file and its `patching` meta."""
    meta = patching_meta(file.attrs)
    if meta is None or "edges" not in meta.get("layout", {}) or "graph" not in meta:
        raise LookupError(f"{getattr(file, 'filename', file)} holds no edge grid: run patching with method eap or eap_ig")
    return np.asarray(file_grid(file, "edges").values, dtype=np.float64), meta


def top_table(writers: list[str], readers: list[str], scores: np.ndarray, top: int) -> Table:
    flat = np.where(np.isnan(scores), -1.0, np.abs(scores)).reshape(-1)
    order = [i for i in np.argsort(-flat, kind="stable")[:top] if flat[i] >= 0]
    rows = [{"writer": writers[i // len(readers)], "reader": readers[i % len(readers)],
             "score": float(scores.reshape(-1)[i])} for i in order]
    return Table(["writer", "reader", "score"], rows)


def file_edges(file: Any, top: int = 20) -> tuple[Table, Any]:
    """(the `top` edges by |score|, the grid as an xarray.DataArray with dims writer, reader and the
    node scores / faithfulness curve in its attrs)."""
    scores, meta = edge_values(file)
    g = meta["graph"]
    return top_table(g["writers"], g["readers"], scores, top), edge_grid(scores, meta)


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
    return grid


def faithfulness_curve(file: Any) -> dict | None:
    meta = patching_meta(file.attrs)
    return None if meta is None else meta.get("faithfulness")


def edges_method(file: Any, top: int = 20) -> tuple[Table, Any]:
    """run.edges(top): an edges run's (patching method eap / eap_ig) top edges by |score| as a Table
    (writer, reader, score) and its [writer, reader] grid as an xarray.DataArray (node scores and the
    faithfulness curve in its attrs). docs/edges.md."""
    return file_edges(file, top)


# what readers show of a patching run beyond its grids: run.edges() (asked through the kind registry)
READER = register_reader(KindReader("patching", present=lambda f: patching_meta(f.attrs) is not None,
                                    methods={"edges": edges_method}))
