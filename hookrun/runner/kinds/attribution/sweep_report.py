"""A sweep of attribution runs compared (`attribution.method=saliency,integrated_gradients,occlusion`):
one table of the methods' mean curve areas (lower deletion, higher insertion is better) and, per curve,
every method's mean curve in one chart (the kind's `sweep` sections, reader.py; [] without curves). A
job not complete is labelled with its status, and the jobs with no row are named in the note.

    sweep_sections(open_sweep("outputs/methods"))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hookrun.analysis.report.plotly_figures import escape
from hookrun.analysis.report.run_sections import section, table_item
from hookrun.analysis.report.sweep_charts import unshown_note
from hookrun.errors import HookrunError
from hookrun.runner.kinds.attribution.report import curve_layout, meta_of

CURVES = ("deletion", "insertion")


def job_rows(sweep: Any) -> tuple[list[dict], list[tuple[str, str]]]:
    """Each readable attribution job: its label (with its status where not complete), method, `at`,
    mean areas and mean curves; and (job, status) of the jobs with no row (refused, not run, ...)."""
    out, missing = [], []
    for job in sweep.jobs:
        if job.file is None:
            missing.append((str(job.num), job.state))
            continue
        try:
            with job.open() as run:
                meta = meta_of(run)
                if meta is None:
                    continue
                a = run.attribution()
                row: dict[str, Any] = {"job": job.num, "method": meta["method"], "at": meta["at"], "samples": int(a.shape[0])}
                for name in CURVES:
                    if f"{name}_area" in a.coords:
                        c = run.attribution(name)
                        row[f"{name} area"] = float(np.mean(a[f"{name}_area"].values))
                        row[name] = (c["fraction"].values.tolist(), c.values.astype(np.float64).mean(0).tolist())
                status = row["status"] = run.status  # (a failed job's rows are partial: never shown as a whole run)
                row["label"] = _label(job, sweep.swept, meta) + (f" ({status})" if status != "complete" else "")
                out.append(row)
        except (HookrunError, OSError, KeyError, ValueError):  # an unreadable job: the sweep table says why
            missing.append((str(job.num), "unreadable"))
    return out, missing


def _label(job: Any, swept: list[str], meta: dict) -> str:
    others = [k for k in swept if k != "attribution.method"]
    return ", ".join([meta["method"], *(f"{k}={job.overrides.get(k)}" for k in others)])


def sweep_sections(sweep: Any) -> list[dict]:
    rows, missing = job_rows(sweep)
    names = [n for n in CURVES if any(f"{n} area" in r for r in rows)]
    if not rows or not names:
        return []
    columns = ["job", "method", "at", "status", "samples", *[f"{n} area" for n in names]]
    items: list[dict] = [table_item(columns, rows)]
    figs = []
    for name in names:
        data = [{"type": "scatter", "mode": "lines+markers", "name": escape(f"{r['label']} ({r[f'{name} area']:.4f})"),
                 "x": r[name][0], "y": r[name][1],
                 "hovertemplate": f"fraction %{{x:.3f}}<br>probability %{{y:.4f}}<extra>{escape(r['label'])}</extra>"}
                for r in rows if name in r]
        layout = curve_layout(f"{name}: mean curve of each method (area in brackets; "
                              f"{'lower' if name == 'deletion' else 'higher'} is better)", name)
        figs.append({"figure": {"data": data, "layout": layout}, "caption": ""})
    items.append({"type": "figures", "title": "each method's mean curve", "figures": figs})
    whole = [r for r in rows if r["status"] == "complete"] or rows  # (the best among the complete jobs)
    best = [f"{n}: {min(whole, key=lambda r: r.get(f'{n} area', np.inf))['label'] if n == 'deletion' else max(whole, key=lambda r: r.get(f'{n} area', -np.inf))['label']}"
            for n in names]
    note = ("deletion: the target's probability as the most important pixels are removed (lower area is better); "
            "insertion: as they are put back onto the baseline (higher is better). Best: " + "; ".join(best)
            + (f". Not shown: {unshown_note(missing, 'row')[2:-1]}" if missing else ""))
    return [section("attribution-methods", f"Attribution methods compared ({len(rows)} runs)", items, note)]
