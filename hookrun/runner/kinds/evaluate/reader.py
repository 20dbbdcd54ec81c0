"""Reading `evaluate`'s metrics back: one row for the run's intervention, a column per metric.

    run = open_run("outputs/.../captures.h5")
    print(run.evaluation())                 # module, ce_clean, ce_intervened, ..., splice metrics
    run.evaluation(batches=True).to_pandas()  # one row per batch

One row, not one per module: a run has one intervened forward (and one ablated one) with every
modify action at once, so its numbers are the joint effect of the modules in /evaluation's
`modules`, and the row's `module` names them all ('transformer.h.0 + transformer.h.2 (joint)').

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
from hookrun.errors import NotFoundError, module_label

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


def intervention_label(modules: list[str]) -> str:
    """The row's name: the one intervened module, or every module a modify action changes, joined and
    marked `(joint)`: the run has one intervened (and one ablated) forward with all of them at once,
    so its numbers are their joint effect, never one module's."""
    names = [module_label(m) for m in modules]
    return names[0] if len(names) == 1 else " + ".join(names) + " (joint)"


def _splice_columns(splices: dict[str, h5py.Group], from_attrs: bool) -> dict[str, tuple[str, str]]:
    """column -> (spliced module, metric): a metric by name where the run has one spliced module, else
    as `MODULE:metric` (the same names in the run's table and a sweep's)."""
    out = {}
    for m, sg in splices.items():
        for k in _metric_names(sg, SPLICE_FIRST, from_attrs):
            out[k if len(splices) == 1 else f"{m}:{k}"] = (m, k)
    return out


def evaluation_table(f: h5py.File, batches: bool = False) -> Table:
    """The run's totals in one row (`batches=True`: one per batch, with the batch's `step` and the
    counts). `module` names the intervention: every modified module's, measured together."""
    g, modules, splices = _parts(f)
    label = intervention_label(modules)
    model_cols = _metric_names(g["model"], MODEL, from_attrs=not batches)
    splice_cols = _splice_columns(splices, from_attrs=not batches)
    if len(splices) == 1:
        splice_cols = {k: splice_cols[k] for k in _order(set(splice_cols), SPLICE_FIRST)}
    if not batches:
        row: dict[str, Any] = {"module": label, **{k: _plain(g["model"].attrs.get(k)) for k in model_cols}}
        row.update({c: _plain(splices[m].attrs.get(k)) for c, (m, k) in splice_cols.items()})
        return Table(["module", *model_cols, *splice_cols], [row])
    steps = g["step"][:]
    model = {k: g["model"][k][:] for k in [*model_cols, *COUNTS] if k in g["model"]}
    spliced = {c: splices[m][k][:] for c, (m, k) in splice_cols.items()}
    rows = []
    for i, step in enumerate(steps.tolist()):
        row = {"step": step, "module": label, **{k: v[i].item() for k, v in model.items()}}
        row.update({c: float(v[i]) for c, v in spliced.items()})
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
    out.update({c: _plain(splices[m].attrs[k]) for c, (m, k) in _splice_columns(splices, True).items()})
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
    """The report's evaluation section: the run's totals, one row for the (joint) intervention."""
    try:
        table = evaluation_table(run.file)
    except Exception:  # none readable
        return []
    return [section("evaluation", "Evaluation", [table_item(table.columns, table.rows)])]


READER = register_reader(KindReader("evaluate", present=has_evaluation, lines=describe, columns=evaluation_columns,
                                    sections=sections, methods={"evaluation": evaluation_table}))
