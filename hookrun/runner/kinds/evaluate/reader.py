"""Reading `evaluate`'s metrics back: one row per intervened module, a column per metric.

    run = open_run("outputs/.../captures.h5")
    print(run.evaluation())                 # module, ce_clean, ce_intervened, ..., splice metrics
    run.evaluation(batches=True).to_pandas()  # one row per (batch, module)

The file's layout is table.py's (docs/format.md); the numbers are read as written (the run's totals
are the attributes the run wrote at its last flush), never recomputed here. Registered below as
evaluate's reader (analysis/kind_readers.py): `run.evaluation(...)`, inspect's lines, a sweep's
columns (plot) and the report's section come from here, asked of the file's kind.
"""

from __future__ import annotations

import json
from typing import Any

import h5py
import numpy as np

from hookrun.analysis.kind_readers import KindReader, Table, register_reader
from hookrun.analysis.report.run_sections import section, table_item
from hookrun.errors import NotFoundError
from hookrun.labels import module_label

GROUP = "evaluation"
MODEL = ("ce_clean", "ce_intervened", "ce_ablated", "ce_loss_score", "kl_intervened", "kl_ablated", "kl_div_score")
COUNTS = ("ce_count", "kl_count")
SPLICE_FIRST = ("l0", "mse", "explained_variance", "dead_fraction")  # the order; others follow by name


def has_evaluation(f: h5py.File) -> bool:
    return GROUP in f and "model" in f[GROUP]


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    return v


def _order(names: set[str], first: tuple[str, ...]) -> list[str]:
    return [n for n in first if n in names] + sorted(names - set(first))


def _parts(f: h5py.File) -> tuple[h5py.Group, list[str], dict[str, h5py.Group]]:
    if not has_evaluation(f):
        raise NotFoundError(f"{f.filename} holds no evaluation (a run with evaluate.enabled=true writes it)")
    g = f[GROUP]
    modules = g.attrs.get("modules", "[]")
    modules = json.loads(modules.decode() if isinstance(modules, bytes) else modules)
    splices = {str(sg.attrs["module"]): sg for sg in (g["splices"].values() if "splices" in g else ())}
    for m in splices:
        if m not in modules:
            modules.append(m)
    return g, modules or [""], splices


def _metric_names(group: h5py.Group, first: tuple[str, ...], from_attrs: bool) -> list[str]:
    names = {k for k in (group.attrs if from_attrs else group) if k not in ("module", *COUNTS)}
    names = {n for n in names if from_attrs or isinstance(group[n], h5py.Dataset)}
    return _order(names, first)


def evaluation_table(f: h5py.File, batches: bool = False) -> Table:
    """The run's totals, one row per intervened module (`batches=True`: one per batch and module,
    with the batch's `step` and the counts)."""
    g, modules, splices = _parts(f)
    model_cols = _metric_names(g["model"], MODEL, from_attrs=not batches)
    splice_cols = _order({n for sg in splices.values() for n in _metric_names(sg, SPLICE_FIRST, not batches)}, SPLICE_FIRST)
    if not batches:
        rows = []
        for m in modules:
            row: dict[str, Any] = {"module": module_label(m)}
            row.update({k: _plain(g["model"].attrs.get(k)) for k in model_cols})
            sg = splices.get(m)
            row.update({k: _plain(sg.attrs.get(k)) if sg is not None else None for k in splice_cols})
            rows.append(row)
        return Table(["module", *model_cols, *splice_cols], rows)
    steps = g["step"][:]
    model = {k: g["model"][k][:] for k in [*model_cols, *COUNTS] if k in g["model"]}
    spliced = {m: {k: sg[k][:] for k in splice_cols if k in sg} for m, sg in splices.items()}
    rows = []
    for i, step in enumerate(steps.tolist()):
        for m in modules:
            row = {"step": step, "module": module_label(m), **{k: v[i].item() for k, v in model.items()}}
            row.update({k: float(spliced[m][k][i]) if m in spliced and k in spliced[m] else None for k in splice_cols})
            rows.append(row)
    counts = [c for c in COUNTS if c in model]
    return Table(["step", "module", *model_cols, *splice_cols, *counts], rows)


def evaluation_columns(f: h5py.File) -> dict[str, Any]:
    """The run's totals as one sweep row's columns: the model's metrics by name; a spliced
    module's by name where the run has one spliced module, else as `MODULE:metric`."""
    if not has_evaluation(f):
        return {}
    g, _, splices = _parts(f)
    out = {k: _plain(g["model"].attrs[k]) for k in _metric_names(g["model"], MODEL, True)}
    for m, sg in splices.items():
        for k in _metric_names(sg, SPLICE_FIRST, True):
            out[k if len(splices) == 1 else f"{m}:{k}"] = _plain(sg.attrs[k])
    return out


def describe(f: h5py.File) -> list[str]:
    """The lines `python -m hookrun.inspect` prints for a file's evaluation (none without one)."""
    if not has_evaluation(f):
        return []
    g = f[GROUP]
    a = {k: (v.decode() if isinstance(v, bytes) else _plain(v)) for k, v in g.attrs.items()}
    head = (f"  evaluation ({g['step'].shape[0]} batches; ablation {a.get('ablation', '?')}, loss {a.get('loss', '?')}"
            + (f", mean of {a['mean']}" if a.get("mean") else "") + ")")
    return [head, *("    " + line for line in str(evaluation_table(f)).splitlines())]


def sections(run: Any) -> list[dict]:
    """The report's evaluation section: the run's totals, one row per intervened module."""
    try:
        table = evaluation_table(run.file)
    except Exception:  # none readable
        return []
    return [section("evaluation", "Evaluation", [table_item(table.columns, table.rows)])]


READER = register_reader(KindReader("evaluate", present=has_evaluation, lines=describe, columns=evaluation_columns,
                                    sections=sections, methods={"evaluation": evaluation_table}))
