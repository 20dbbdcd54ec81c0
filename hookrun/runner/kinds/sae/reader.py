"""What readers show of an sae run: its training curves, the last step's figures, a sweep's table.

    run = hookrun.open_run("outputs/h3_sae")
    run.sae_curves()             # Table: step, then SAELens' figures of each training step
    run.sae                      # the block as run, the capture's module, d_in, epochs, out

`python -m hookrun.inspect` prints the last step's figures, `python -m hookrun.plot` draws the
curves (loss terms, L0, explained variance, dead and silent features, lr), `open_sweep` gives one row per job
with the last step's l0, explained_variance, mse_loss, overall_loss, dead_features and silent_features (and, where
sae.evaluate was on, the held-out ce_loss_score and kl_div_score: `run.sae_evaluation`), and the report
of a sweep draws L0 against explained variance, and against ce_loss_score where evaluate was on.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np

from hookrun.analysis.kind_readers import KindReader, Table
from hookrun.analysis.report.figure_specs import Lines, Scatter
from hookrun.analysis.report.run_sections import figure, section, table_item
from hookrun.analysis.report.sweep_charts import unshown_note
from hookrun.error_words import json_attribute
from hookrun.errors import NotFoundError
from hookrun.runner.kinds.sae.block import UNITS
from hookrun.store.listing import is_capture, row_index

GROUP = "captures/sae/curves"
COLUMNS = ("l0", "explained_variance", "mse_loss", "overall_loss", "dead_features", "silent_features")
MODEL = ("ce_clean", "ce_intervened", "ce_ablated", "ce_loss_score", "kl_div_score")  # sae.evaluate's, kept
SPLICE = ("l0", "mse", "explained_variance", "dead_fraction")
PLOTTED = {"loss": ("overall_loss", "mse_loss"), "l0": ("l0",), "explained_variance": ("explained_variance",),
           "dead_features": ("dead_features", "silent_features"), "lr": ("lr",)}
LABELS = {"dead_features": ("latents", "latents silent (SAELens' dead_features: over dead_feature_window steps)")}


def sae_meta(attrs: Mapping) -> dict[str, Any]:
    return json_attribute(attrs, "sae", {})


def evaluation(attrs: Mapping) -> dict[str, Any]:
    """sae.evaluate's totals (kind.py): {file, items, module, model: {ce_loss_score, ...}, splice: {l0, ...}}."""
    return json_attribute(attrs, "sae_evaluation", {})


def evaluated(f: h5py.File) -> dict[str, Any]:
    """The evaluation's figures in one mapping: the model's scores and the splice's metrics."""
    ev = evaluation(f.attrs)
    return {**{k: ev["model"][k] for k in MODEL if k in ev.get("model", {})},
            **{k: ev["splice"][k] for k in SPLICE if k in ev.get("splice", {})}} if ev else {}


def curves(f: h5py.File) -> Table:
    """One row per training step: its number and SAELens' figures of that step."""
    if GROUP not in f:
        return Table(["step"], [])
    group, steps = f[GROUP], f["samples/index"][:]
    names = [n for n in group if is_capture(group[n])]  # (not a figure's `.index` sibling)
    values = {n: _by_step(f, group[n], steps) for n in names}
    rows = [{"step": int(s), **{n: float(values[n][i]) for n in names}} for i, s in enumerate(steps)]
    return Table(["step", *names], rows)


def _by_step(f: h5py.File, ds: h5py.Dataset, steps: np.ndarray) -> np.ndarray:
    """A figure's value at each step (its rows' steps: store.listing.row_index), NaN at the steps it
    lacks (a run of an earlier hookrun resumed by one that logs more figures: silent_features from its resume on)."""
    out, at = np.full(len(steps), np.nan), {int(s): i for i, s in enumerate(steps)}
    out[[at[int(s)] for s in row_index(f, ds)]] = ds[:]
    return out


def curves_method(f: h5py.File) -> Table:
    """run.sae_curves(): the curves, or one NotFoundError line on a run of another kind."""
    if GROUP not in f and "sae" not in f.attrs:
        raise NotFoundError(f"{f.filename} is not an sae training run (no /{GROUP}); runs with an sae: block write one")
    return curves(f)


def last(f: h5py.File) -> dict[str, Any]:
    t = curves(f)
    return t.rows[-1] if len(t) else {}


def lines(f: h5py.File) -> list[str]:
    meta, end = sae_meta(f.attrs), last(f)
    source = (f"{meta.get('at')}'s output on the fly" if meta.get("at") else
              f"{meta.get('from')} {meta.get('capture')} ({meta.get('cache_rows')} rows, {meta.get('epochs')} epoch(s))")
    head = (f"  sae      {meta.get('architecture')} d_in {meta.get('d_in')} d_sae {meta.get('d_sae')} on {source}; "
            f"out {meta.get('out')}")
    if not end:
        return [head, "  sae      no training step written"]
    figures = "  ".join(f"{k} {_fmt(v)}" for k, v in end.items() if k != "step")
    out = [head, f"  last step {end['step']}: {figures}"]
    ev = evaluated(f)
    if ev:
        meta_ev = evaluation(f.attrs)
        out.append(f"  evaluate ({meta_ev['items']} held-out items, {meta_ev['file']}): "
                   + "  ".join(f"{k} {_fmt(v)}" for k, v in ev.items()))
    return out


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def columns(f: h5py.File) -> dict[str, Any]:
    end, ev = last(f), evaluated(f)
    return {**{c: end[c] for c in COLUMNS if c in end},
            **{c: ev[c] for c in ("ce_loss_score", "kl_div_score") if c in ev}}


def figures(run: Any) -> list[tuple[str, Any]]:
    t = curves(run.file)
    if not len(t):
        return []
    x = [float(s) for s in t.column("step")]  # floats: a scale, not one category per step
    out = []
    for stem, names in PLOTTED.items():
        series = {n: t.column(n) for n in names if n in t.columns}
        if series:
            ylabel, title = LABELS.get(stem, (stem, f"{stem} per step"))
            out.append((f"sae_{stem}", Lines(x=x, series=series, xlabel="training step", ylabel=ylabel,
                                             title=f"SAE training: {title}")))
    return out


def sections(run: Any) -> list[dict]:
    t, meta = curves(run.file), sae_meta(run.file.attrs)
    if not len(t):
        return []
    items = [table_item(["step", *[c for c in t.columns if c != "step"]], [t.rows[-1]])]
    ev = evaluated(run.file)
    if ev:
        items.append(table_item(list(ev), [ev]))
    items += [figure(spec) for _, spec in figures(run)]
    ev_file = evaluation(run.file.attrs).get("file")
    top = f"; its latents' top examples: python -m hookrun.report {ev_file}" if ev_file else ""
    return [section("sae", f"SAE training ({meta.get('architecture')}, d_sae {meta.get('d_sae')})", items,
                    note=f"the trained SAE: {meta.get('out')}{top}")]


def _frontier(sweep: Any) -> tuple[list[dict], list[Scatter]]:
    """The jobs' last-step numbers and the charts: sparsity against reconstruction, and
    against the spliced model's loss recovered where sae.evaluate was on (two jobs or more)."""
    table = sweep.table(captures=[])
    listed = [r for r in table.rows if "l0" in r and "explained_variance" in r]
    rows = [r for r in listed if _finite(r, "l0", "explained_variance")]  # (a diverged job's NaN: listed, said, not drawn)
    if len(listed) < 2 or len(rows) < 2:
        return (listed if len(listed) >= 2 else []), []
    note = unshown_note([(str(r["job"]), str(r.get("status"))) for r in table.rows
                         if not any(r is k for k in rows)], "point")
    labels = [(", ".join(f"{k}={r[k]}" for k in sweep.swept) or f"job {r['job']}")
              + (f" ({r.get('status')})" if r.get("status") != "complete" else "") for r in rows]  # (not complete: said)
    charts = [Scatter(x=np.array([r["l0"] for r in rows]), y=np.array([r["explained_variance"] for r in rows]),
                      xlabel="L0: latents active per row (last training step)",
                      ylabel="explained variance (last training step)",
                      title=f"SAE sweep: sparsity against reconstruction{note}", labels=labels, annotate=True)]
    scored = [(label, r) for label, r in zip(labels, rows, strict=True) if _finite(r, "ce_loss_score")]
    if len(scored) >= 2:  # sae.evaluate was on: what the sparsity costs the model
        kept = [r for _, r in scored]
        note = unshown_note([(str(r["job"]), str(r.get("status"))) for r in table.rows
                             if not any(r is k for k in kept)], "point")
        charts.append(Scatter(x=np.array([r["l0"] for _, r in scored]), y=np.array([r["ce_loss_score"] for _, r in scored]),
                              xlabel="L0: latents active per row (last training step)",
                              ylabel="ce_loss_score: loss recovered, spliced (held-out items)",
                              title=f"SAE sweep: sparsity against the spliced model's loss recovered{note}",
                              labels=[label for label, _ in scored], annotate=True))
    return listed, charts


def _finite(row: Mapping, *keys: str) -> bool:
    return all(isinstance(row.get(k), numbers.Real) and np.isfinite(float(row[k])) for k in keys)


def sweep_figures(sweep: Any) -> list[tuple[str, Any]]:
    _, charts = _frontier(sweep)
    return list(zip(["sae_sweep_l0_vs_explained_variance", "sae_sweep_l0_vs_ce_loss_score"], charts, strict=False))


def sweep_sections(sweep: Any) -> list[dict]:
    rows, charts = _frontier(sweep)
    if not rows:
        return []
    cols = ["job", *sweep.swept, *[c for c in (*COLUMNS, "ce_loss_score", "kl_div_score") if any(c in r for r in rows)]]
    return [section("sae-sweep", f"SAE sweep ({len(rows)} runs)", [table_item(cols, rows), *map(figure, charts)])]


READER = KindReader("sae", present=lambda f: "sae" in f.attrs, lines=lines, columns=columns, sections=sections,
                    sweep=sweep_sections, sweep_figures=sweep_figures, figures=figures, units=UNITS,
                    methods={"sae_curves": curves_method}, properties={"sae": sae_meta, "sae_evaluation": evaluation})
