"""The report's page of a sweep of attribution runs (`attribution.method=saliency,integrated_gradients,
occlusion`): one table that compares the methods by their curves' mean areas (lower deletion, higher
insertion is better) and, per curve, every method's mean curve in one chart. Registered as the kind's
`sweep` sections (reader.py); [] where no job is an attribution run with curves.

    sweep_sections(open_sweep("outputs/methods"))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hookrun.analysis.report.plotly_figures import escape
from hookrun.analysis.report.run_sections import section, table_item
from hookrun.errors import HookrunError
from hookrun.runner.kinds.attribution.report import curve_layout, meta_of

CURVES = ("deletion", "insertion")


def job_rows(sweep: Any) -> list[dict]:
    """Each readable attribution job: its label, method, `at`, mean areas and mean curves."""
    out = []
    for job in sweep.jobs:
        if job.file is None:
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
                row["label"] = _label(job, sweep.swept, meta)
                out.append(row)
        except (HookrunError, OSError, KeyError, ValueError):  # an unreadable job: the sweep table says why
            continue
    return out


def _label(job: Any, swept: list[str], meta: dict) -> str:
    others = [k for k in swept if k != "attribution.method"]
    return ", ".join([meta["method"], *(f"{k}={job.overrides.get(k)}" for k in others)])


def sweep_sections(sweep: Any) -> list[dict]:
    rows = job_rows(sweep)
    names = [n for n in CURVES if any(f"{n} area" in r for r in rows)]
    if not rows or not names:
        return []
    columns = ["job", "method", "at", "samples", *[f"{n} area" for n in names]]
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
    best = [f"{n}: {min(rows, key=lambda r: r.get(f'{n} area', np.inf))['label'] if n == 'deletion' else max(rows, key=lambda r: r.get(f'{n} area', -np.inf))['label']}"
            for n in names]
    note = ("deletion: the target's probability as the most important pixels are removed (lower area is better); "
            "insertion: as they are put back onto the baseline (higher is better). Best: " + "; ".join(best))
    return [section("attribution-methods", f"Attribution methods compared ({len(rows)} runs)", items, note)]
