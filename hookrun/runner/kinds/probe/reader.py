"""What readers show of a probe run, from its file alone (/probe, table.py): registered as the kind's
reader through its plugin (hookrun/config/plugins.py).

    run = open_run("outputs/probe_shapes")
    run.probes()                      # Table: at, rows, features, train, test, control, selectivity, majority
    w, b = run.probe_weights("block3")   # the probe's direction(s) on the pooled activations

inspect prints one line per hook point; plot draws the test accuracy (or R^2), the training score
and the control task's test accuracy against depth, with the majority class's test accuracy (chance)
as a dashed line (`probe_depth.png`); the report adds the table
and that chart; a sweep (`probe.C=0.01,1,100`) gets each job's test score per hook point as columns
of open_sweep's table (`test@block3`), and the report a chart of them against depth.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hookrun.analysis.kind_readers import KindReader, Table
from hookrun.error_words import json_attribute
from hookrun.errors import NotFoundError
from hookrun.runner.kinds.probe.table import point_group, point_groups

MAJORITY = "majority class (test): chance"
COLUMNS = ["at", "rows", "features", "train", "test", "control", "selectivity", "majority", "converged"]


def _groups(f: Any) -> list[Any]:
    if "probe" not in f:
        raise NotFoundError(f"{f.filename} holds no probes (/probe): the run is not a complete probe run")
    return point_groups(f)


def read_probes(f: Any) -> Table:
    """run.probes(): one row per hook point, in the order their outputs come in the forward: rows, features, train and test score
    (accuracy, or R^2 for regression), the control task's test accuracy, the selectivity, and the test
    accuracy of always naming the training rows' commonest class (chance; None for regression, and in
    files written before hookrun kept it)."""
    rows = []
    for pg in _groups(f):
        a = pg.attrs
        get = lambda k, a=a: float(a[k]) if k in a else None  # noqa: E731
        rows.append({"at": str(a["module"]), "rows": int(a["rows"]), "features": int(a["features"]),
                     "train": get("train_score"), "test": get("test_score"), "control": get("control_test_score"),
                     "selectivity": get("selectivity"), "majority": get("majority_test_score"),
                     "converged": bool(a["converged"]) and bool(a.get("control_converged", True)) if "converged" in a
                     else None})  # (None: ridge, a closed form; False where the probe's or the control's fit stopped short)
    return Table(list(COLUMNS), rows)


def probe_weights(f: Any, at: str) -> tuple[np.ndarray, np.ndarray]:
    """run.probe_weights(at): (weight (classes or 1, features), bias) with scores = x @ weight.T + bias on
    the pooled activations of hook point `at`."""
    groups = _groups(f)  # (NotFoundError where the file holds no /probe)
    pg = point_group(f, at)
    if pg is not None:
        return pg["weight"][:], pg["bias"][:]
    raise NotFoundError(f"no probe at {at!r}; the probes: {', '.join(str(g.attrs['module']) for g in groups)}")


def _metric(f: Any) -> str:
    return str(f["probe"].attrs.get("metric", "accuracy"))


def lines(f: Any) -> list[str]:
    if "probe" not in f:
        return ["  probe     no results (the run did not reach its last batch)"]
    meta = json_attribute(f.attrs, "probe", {})
    head = (f"  probe     {meta.get('method')} ({'C=' + str(meta.get('C')) if meta.get('method') == 'logistic' else 'alpha=' + str(meta.get('alpha'))}), "
            f"pool {meta.get('pool')}, {_metric(f)} on held-out items")
    out = [head]
    for pg, r in zip(_groups(f), read_probes(f), strict=True):
        ctrl = f", control {r['control']:.3f}, selectivity {r['selectivity']:.3f}" if r["control"] is not None else ""
        chance = f", majority class {r['majority']:.3f}" if r["majority"] is not None else ""
        a = pg.attrs
        stopped = (f", NOT CONVERGED (stopped after {int(a['iterations'])} iterations: its weights are not the optimum)"
                   if "converged" in a and not a["converged"] else "")
        if "control_converged" in a and not a["control_converged"]:
            stopped += (f", control NOT CONVERGED (stopped after {int(a['control_iterations'])} iterations: the control "
                        f"and the selectivity are not the optimum's)")
        out.append(f"    {r['at']:<20} {r['rows']:>7} rows x {r['features']:<5} train {r['train']:.3f}  test {r['test']:.3f}"
                   f"{ctrl}{chance}{stopped}")
    return out


def columns(f: Any) -> dict[str, Any]:
    """A sweep table's numbers: each hook point's test score (and control, selectivity)."""
    if "probe" not in f:
        return {}
    out: dict[str, Any] = {}
    probes = read_probes(f)
    for r in probes:
        out[f"test@{r['at']}"] = r["test"]
        if r["control"] is not None:
            out[f"selectivity@{r['at']}"] = r["selectivity"]
    flags = [c for c in probes.column("converged") if c is not None]
    if flags:  # (logistic: a job whose fits stopped at max_iter is not read as the optimum's numbers)
        out["probe converged"] = all(flags)
    return out


def depth_figure(f: Any) -> Any:
    from hookrun.analysis.report.figure_specs import Lines

    t = read_probes(f)
    metric = _metric(f)
    series: dict[str, list] = {f"test {metric}": t.column("test"), f"train {metric}": t.column("train")}
    if any(v is not None for v in t.column("control")):
        series["control task (test)"] = t.column("control")
    references = ()
    if any(v is not None for v in t.column("majority")):
        series[MAJORITY] = t.column("majority")
        references = (MAJORITY,)
    meta = json_attribute(f.attrs, "probe", {})
    return Lines(x=t.column("at"), series=series, xlabel="hook point (depth order)", ylabel=metric,
                 title=f"linear probe ({meta.get('method', '')}) {metric} by depth{_unconverged(t)}", in_order=True,
                 references=references)


def _unconverged(t: Table) -> str:
    """A picture's note of the fits that stopped at probe.max_iter (the probe's or its control's): their
    scores are drawn, and are not the optimum's."""
    stopped = [r["at"] for r in t if r["converged"] is False]
    return (f"\nNOT CONVERGED at {', '.join(stopped)}: not the optimum's scores (raise probe.max_iter)"
            if stopped else "")


def figures(run: Any) -> list[tuple[str, Any]]:
    return [("probe_depth", depth_figure(run.file))] if "probe" in run.file else []


def sections(run: Any) -> list[dict]:
    from hookrun.analysis.report.run_sections import figure, section, table_item

    if "probe" not in run.file:
        return []
    t = read_probes(run.file)
    regression = _metric(run.file) == "r2"
    note = ("Each hook point's probe is fitted on the training items' rows and scored on the held-out items"
            + (" by R² (a regression: no control task, no majority class)." if regression else
               "; the control task (Hewitt & Liang 2019) gives each input identity a random class, and selectivity is "
               "the test accuracy minus the control's: a high score with low selectivity says the probe memorises "
               "identities." if any(r["control"] is not None for r in t) else " by their accuracy."))
    return [section("probe", "Linear probes by depth", [table_item(t.columns, t.rows), figure(depth_figure(run.file))],
                    note)]


def _by_depth(sweep: Any) -> tuple[list[dict], Any]:
    """Each job's test score at each hook point: the table's rows and the chart (one line per job).
    Jobs that probe other hook points (a sweep over models) share an axis of positions in `at`, never
    one job's names under another's scores."""
    from hookrun.analysis.report.figure_specs import Lines
    from hookrun.analysis.report.sweep_charts import unshown_note

    jobs: list[tuple[str, list[str], list[float]]] = []
    rows, missing = [], []  # (missing: the jobs with no line, named in the title)
    for job in sweep.jobs:
        if job.file is None:
            missing.append((str(job.num), job.state))  # (as the sweep table says)
            continue
        status = "unreadable"
        try:
            with job.open() as run:
                status = run.status
                t = read_probes(run.file)
        except (NotFoundError, OSError, KeyError):
            missing.append((str(job.num), status))
            continue
        label = ", ".join(f"{k}={job.overrides.get(k)}" for k in sweep.swept) or str(job.num)
        label += f" ({status})" if status != "complete" else ""  # (a job not complete is never shown as one)
        label += " (NOT CONVERGED)" if any(c is False for c in t.column("converged")) else ""
        jobs.append((label, t.column("at"), t.column("test")))
        rows.append({"job": job.num, "label": label, "status": status, **{f"test@{r['at']}": r["test"] for r in t}})
    same = all(at == jobs[0][1] for _, at, _ in jobs)
    width = max((len(at) for _, at, _ in jobs), default=0)
    x = jobs[0][1] if jobs and same else [str(i + 1) for i in range(width)]
    series = {label: [*test, *[None] * (width - len(test))] for label, _, test in jobs}
    chart = Lines(x=x, series=series, ylabel="test score", in_order=True,
                  xlabel="hook point (depth order)" if same else "hook point: position in each job's probe.at",
                  title=f"linear probes: test score by depth, one line per job{unshown_note(missing)}")
    return rows, chart


def sweep_figures(sweep: Any) -> list[tuple[str, Any]]:
    rows, chart = _by_depth(sweep)
    return [("probe_sweep_test_by_depth", chart)] if rows else []


def sweep_sections(sweep: Any) -> list[dict]:
    from hookrun.analysis.report.run_sections import figure, section, table_item

    rows, chart = _by_depth(sweep)
    if not rows:
        return []
    return [section("probe-sweep", f"Linear probes across the sweep ({len(rows)} runs)",
                    [table_item(list(dict.fromkeys(k for r in rows for k in r)), rows), figure(chart)])]


READER = KindReader("probe", present=lambda f: "probe" in f.attrs, lines=lines, columns=columns, sections=sections,
                    sweep=sweep_sections, sweep_figures=sweep_figures, figures=figures,
                    methods={"probes": read_probes, "probe_weights": probe_weights})
