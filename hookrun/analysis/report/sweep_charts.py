"""A sweep's charts, shared by `plot` and `report`: each metric of the jobs against each swept value
(figure specs: figure_specs.Lines).

    metrics = sweep_metrics(table, sweep.swept)      # the columns with numbers in two jobs or more
    charts = sweep_charts(table, sweep.swept, metrics)

A job with no point (not run, no file) is named as such in the chart's title, and a job not
complete (running, interrupted, failed) as having a partial point; a swept value no job has a point
at is left off the axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hookrun.analysis.report.figure_specs import Lines, category_key, is_categorical


def sweep_charts(table: Any, swept: Sequence[str], metrics: Sequence[str]) -> list[Lines]:
    """One chart per (metric, swept parameter): the metric of each job against the parameter's
    value, with the jobs' other swept values as separate lines. A metric with no number in any
    job makes no chart."""
    charts = []
    for metric in metrics:
        ys_all = table.column(metric)
        if not any(_number(v) is not None for v in ys_all):
            continue
        note = _jobs_note(table.rows, ys_all)
        for key in swept:
            others = [k for k in swept if k != key]
            groups: dict[str, list[int]] = {}
            for i, row in enumerate(table.rows):
                name = ", ".join(f"{k}={row.get(k)}" for k in others) or metric
                groups.setdefault(name, []).append(i)
            xs = table.column(key)  # (each value once on the axis: with two swept keys, two jobs share it)
            ordered = list({repr(xs[i]): xs[i] for i in sorted(range(len(xs)), key=lambda i: category_key(xs[i]))}.values())
            series = {name: [{repr(xs[i]): _number(ys_all[i]) for i in rows}.get(repr(x)) for x in ordered]
                      for name, rows in groups.items()}
            shown = [j for j in range(len(ordered)) if any(ys[j] is not None for ys in series.values())]  # (a value no job has a point at: off the axis)
            ordered, series = [ordered[j] for j in shown], {name: [ys[j] for j in shown] for name, ys in series.items()}
            charts.append(Lines(ordered, series, key, metric, f"{metric} against {key}{note}", log_x=decades(ordered)))
    return charts


def _jobs_note(rows: Sequence[dict], ys: Sequence[Any]) -> str:
    """What a chart's title says of its jobs: those with no point, by status (`job 2, 3 not run: no
    point`), and those not complete whose point is partial (running, interrupted, failed)."""
    parts = _unshown([(str(row["job"]), str(row.get("status") or "no number"))
                      for row, y in zip(rows, ys, strict=True) if _number(y) is None], "point")
    partial = [str(row["job"]) for row, y in zip(rows, ys, strict=True) if _number(y) is not None and row.get("status") not in ("complete", None)]
    if partial:
        parts.append(f"job {', '.join(partial)} not complete: {'its' if len(partial) == 1 else 'their'} points partial")
    return f" ({'; '.join(parts)})" if parts else ""


def unshown_note(missing: Sequence[tuple[str, str]], what: str = "line") -> str:
    """A kind's sweep chart's title note for the jobs it has no `what` for, from (job, status) pairs
    (`job 1 failed: no line; job 2 not run: no line`), "" where every job is drawn."""
    parts = _unshown(missing, what)
    return f" ({'; '.join(parts)})" if parts else ""


def _unshown(missing: Sequence[tuple[str, str]], what: str) -> list[str]:
    """(job, status) pairs with nothing drawn, by status in their order: ['job 1, 3 failed: no line', ...]."""
    by_status: dict[str, list[str]] = {}
    for job, status in missing:  # ('refused: LINE', 'unreadable: LINE': the word; the table has the line)
        by_status.setdefault(status.partition(": ")[0], []).append(job)
    return [f"job {', '.join(jobs)} {status}: no {what}" for status, jobs in by_status.items()]


def decades(values: Sequence[Any]) -> bool:
    """A swept value to draw on a log axis: positive numbers, a float among them, spanning two decades
    or more (C=0.01,1,100; a learning rate), which a linear axis would crowd into one corner."""
    nums = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return (len(nums) == len(values) >= 2 and not is_categorical(values) and min(nums) > 0
            and max(nums) / min(nums) >= 100)


def sweep_metrics(table: Any, swept: Sequence[str]) -> list[str]:
    """The columns of a sweep table that hold numbers in two jobs or more (one point against a swept
    value shows nothing) and are not overrides: the kinds' metrics first (as the table orders them),
    then the captures' statistics."""
    skip = {"job", "status", "text", *swept}
    keys = [c for c in table.columns if c not in skip and c not in _overrides(table, swept)]
    return [c for c in keys if sum(_number(v) is not None for v in table.column(c)) >= 2]


def not_drawn(table: Any, column: str) -> str:
    """Why a column sweep_metrics left out is not drawn, truthfully: a True/False column (a probe's
    `converged`) is not drawn as a number; any other has a number in fewer than two jobs."""
    given = [v for v in table.column(column) if v is not None]
    if given and all(isinstance(v, bool | np.bool_) for v in given):
        return "True/False in each job: a yes/no column is not drawn as a number (the sweep's table shows it)"
    return "fewer than two jobs wrote a number to it"


def _overrides(table: Any, swept: Sequence[str]) -> set[str]:
    cols = table.columns
    end = cols.index("status") if "status" in cols else 0
    return set(cols[1:end])


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float | np.number):
        f = float(v)
        return f if np.isfinite(f) else None
    return None
