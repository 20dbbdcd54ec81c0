"""What readers show of a similarity run, from its file alone (the kind's reader, found through its
plugin by the file's `kind` attribute):

    run = open_run("outputs/cka")
    run.similarity()             # xarray.DataArray (at, with_at): the measure of every pair
    python -m hookrun.inspect outputs/cka        # the matrix's lines; plot / report: its heatmap

The matrix is the features capture captures/similarity/__model__/MEASURE (written once, at the end of
a complete pass); the root attribute `similarity` (JSON) holds its labels, the block as run and the route.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np

from hookrun.analysis.kind_readers import KindReader
from hookrun.analysis.report.figure_specs import Heatmap, NotShown
from hookrun.error_words import json_attribute
from hookrun.errors import HookrunError, NotFoundError

NAMES = {"linear_cka": "linear CKA", "rbf_cka": "RBF CKA", "rsa": "RSA (Spearman)"}


def meta(attrs: Any) -> dict | None:
    return json_attribute(attrs, "similarity")


def matrix(f: h5py.File) -> tuple[np.ndarray, dict]:
    """The matrix (rows x cols, float64) and the run's `similarity` attribute."""
    m = meta(f.attrs)
    if m is None:
        raise NotFoundError(f"{f.filename} is no similarity run (no `similarity` root attribute)")
    path = f"captures/similarity/__model__/{m['measure']}"
    if path not in f:
        raise NotFoundError(f"{f.filename}: the similarity matrix is written at the end of a complete pass; this "
                            f"run's status is {f.attrs.get('status')!r} (run it again to the end)")
    return np.asarray(f[path][()], dtype=np.float64), m


def read_similarity(f: h5py.File) -> Any:
    """The matrix as an xarray.DataArray: dims (at, with_at), the module names as coordinates."""
    try:
        import xarray as xr
    except ModuleNotFoundError:
        raise HookrunError("run.similarity() is a labelled array and needs xarray: pip install 'hookrun[xarray]'") from None
    z, m = matrix(f)
    attrs = {k: m[k] for k in ("measure", "estimator", "route", "pool") if k in m}
    return xr.DataArray(z, dims=("at", "with_at"), coords={"at": m["rows"], "with_at": m["cols"]},
                        name=m["measure"], attrs=attrs)


def _short(target: Any) -> str:
    """A model's `_target_` by its last name (torchvision.models.resnet18 -> resnet18)."""
    return str(target or "model").rpartition(".")[2]


def title(m: dict) -> str:
    """`linear CKA · resnet18 vs resnet34`: the measure (rbf CKA's sigma, RSA's dissimilarity: runs that differ
    in them are told apart) and the models (their targets' last names)."""
    models = f"{_short(m.get('model'))} vs {_short(m['with'])}" if m.get("with") else _short(m.get("model"))
    measure = m["measure"]
    words = [{"rsa": "Spearman"}.get(measure, ""),
             f"sigma {m['sigma']:g}" if measure == "rbf_cka" and m.get("sigma") is not None else "",
             {"correlation": "1 - Pearson r", "euclidean": "Euclidean distance"}.get(m.get("dissimilarity"), "")
             if measure == "rsa" else "",
             {"unbiased": "unbiased HSIC", "minibatch": "minibatch"}.get(m.get("estimator"), "")]
    name = {"rsa": "RSA"}.get(measure, NAMES.get(measure, measure))
    return f"{name}{' (' + ', '.join(w for w in words if w) + ')' if any(words) else ''} · {models}"


def spec(f: h5py.File) -> Heatmap:
    z, m = matrix(f)
    ylabel = f"at ({_short(m.get('model'))})"
    xlabel = f"with.at ({_short(m['with'])})" if m.get("with") else ylabel
    note = f" (n/a: {'; '.join(_undefined(m))})" if not np.isfinite(z).all() else ""
    # -1 to 1, diverging about 0: a rank correlation (RSA) and CKA from an unbiased HSIC, which is negative
    # where two hook points share less than chance; CKA (biased) 0 to 1
    signed = m["measure"] == "rsa" or m.get("estimator") in ("unbiased", "minibatch")
    return Heatmap(z=z, title=title(m) + note, x=m["cols"], y=m["rows"], xlabel=xlabel, ylabel=ylabel,
                   label=NAMES.get(m["measure"], m["measure"]), range=(-1.0, 1.0) if signed else (0.0, 1.0),
                   centre=0.0 if signed else None, cells=[[_cell(v, f".{_decimals(z)}f") for v in row] for row in z])


def _undefined(m: dict) -> list[str]:
    """Why the n/a cells are undefined, as the run found; where it recorded no cause, `undefined` (no guess)."""
    return sorted(set(m.get("undefined", {}).values())) or ["undefined"]


def _decimals(z: np.ndarray) -> int:
    """The cells' decimals: 2, or more where the values lie closer (0.9975 and 0.9632 written 1.00 and
    0.96 would hide what the matrix shows), at most 4 (inspect's)."""
    finite = z[np.isfinite(z)]
    spread = float(finite.max() - finite.min()) if finite.size else 1.0
    return 2 if spread >= 0.1 or spread == 0 else 3 if spread >= 0.01 else 4


def _cell(v: float, form: str) -> str:
    """A value, or n/a where the measure is undefined (NaN: a hook point whose features are one
    vector for every item, so its centred Gram matrix is 0; for RSA by correlation, one item's features
    all equal)."""
    return format(v, form) if np.isfinite(v) else "n/a"


def _over(m: dict) -> str:
    """The items the matrix is over: every item, or the minibatch estimator's full batches (a last, smaller
    batch's items left out, `left_out`)."""
    if m.get("estimator") != "minibatch":
        return "every item of the run"
    left = m.get("left_out") or 0
    return "the run's full batches, averaged" + (f" (the last batch's {left} item(s) left out)" if left else "")


def _complete(f: h5py.File) -> bool:
    m = meta(f.attrs)
    return m is not None and f"captures/similarity/__model__/{m['measure']}" in f


def lines(f: h5py.File) -> list[str]:
    m = meta(f.attrs)
    if m is None:
        return []
    head = f"similarity: {title(m)}; estimator {m['estimator']} ({m['route']} route), pool {m['pool']}"
    if not _complete(f):
        return [head, "  no matrix: the pass did not finish"]
    z, _ = matrix(f)
    cells = [[_cell(v, ".4f") for v in values] for values in z]
    width = max(6, *(len(c) for c in m["cols"]), *(len(c) for row in cells for c in row))  # (0.6877; -0.0066 is 7)
    rows = [f"  {'':{max(len(r) for r in m['rows'])}}  " + "  ".join(f"{c:>{width}}" for c in m["cols"])]
    for r, values in zip(m["rows"], cells, strict=True):
        rows.append(f"  {r:{max(len(r) for r in m['rows'])}}  " + "  ".join(f"{v:>{width}}" for v in values))
    if not np.isfinite(z).all():
        named = m.get("undefined") or {}
        why = "; ".join(f"{n}: {why}" for n, why in named.items())
        rows.append(f"  n/a: undefined ({why})" if why else "  n/a: undefined")
    axes = [f"  rows: at ({_short(m.get('model'))}); columns: with.at ({_short(m['with'])})"] if m.get("with") else []
    left = [f"  over {_over(m)}"] if m.get("left_out") else []
    return [head, *left, *axes, *rows]  # (two models: which is which, as the picture's axis labels say)


def figures(run: Any) -> list[tuple[str, Any]]:
    return [("similarity", spec(run.file))] if _complete(run.file) else []


def sections(run: Any) -> list[dict]:
    from hookrun.analysis.report.run_sections import figure, section

    if not _complete(run.file):
        return []
    m = meta(run.file.attrs)
    note = (f"Each cell compares the rows of two hook points over {_over(m)} ({m['route']} route); "
            f"1 is the same representation up to rotation and scale (CKA) or the same ranking of distances (RSA).")
    return [section("similarity", "Representational similarity", [figure(spec(run.file))], note)]


SWEEP_JOBS = 12  # the most jobs whose matrices a sweep's report shows side by side


def sweep_figures(sweep: Any) -> list[tuple[str, Heatmap | NotShown]]:
    """Each complete job's heatmap on its measure's scale, titled by its swept values (plot draws every
    job): (file stem, spec); then the jobs with no matrix, as the report's note names them."""
    drawn, missing = _job_heatmaps(sweep, None)
    return [(f"similarity_job{num}", heat) for num, heat in drawn] + [("similarity", n) for n in _not_shown(missing)]


def _not_shown(missing: list[tuple[str, str]]) -> list[NotShown]:
    """The jobs with no matrix (plot's `not drawn:` line and the report's note say it alike)."""
    from hookrun.analysis.report.sweep_charts import unshown_note

    return [NotShown("each job's matrix", unshown_note(missing, "matrix")[2:-1])] if missing else []


def _job_heatmaps(sweep: Any, limit: int | None) -> tuple[list[tuple[int, Heatmap]], list[tuple[str, str]]]:
    """(job number, heatmap) of the complete ones among the first `limit` jobs (None: all), and
    (job number, status) of those among them with no matrix (failed, refused, not run, ...)."""
    drawn, missing = [], []
    for job in sweep.jobs[:limit]:
        if job.file is None:
            missing.append((str(job.num), job.state))
            continue
        status = "unreadable"
        try:
            with job.open() as run:
                status = run.status
                heat = spec(run.file) if _complete(run.file) else None
        except (HookrunError, OSError, KeyError):  # an unreadable job: the sweep table says so
            heat = None
        if heat is None:
            missing.append((str(job.num), status if status != "complete" else "complete, with no matrix"))
            continue
        label = ", ".join(f"{k}={job.overrides.get(k)}" for k in sweep.swept) or f"job {job.num}"
        heat.title = f"{label} · {heat.title}"
        drawn.append((job.num, heat))
    return drawn, missing


def sweep_sections(sweep: Any) -> list[dict]:
    """A sweep's matrices (over models, measures, data): each job's heatmap on its measure's one scale,
    and the jobs with none named (failed, refused, not run)."""
    from hookrun.analysis.report.run_sections import figure, section

    drawn, missing = _job_heatmaps(sweep, SWEEP_JOBS)
    if not drawn:
        return []
    items = [figure(heat, caption=f"job {num}") for num, heat in drawn]
    more = len(sweep.jobs) - SWEEP_JOBS
    note = ("Each job's matrix on its measure's one colour scale (CKA 0 to 1, RSA -1 to 1)."
            + "".join(f" Not shown: {n.why}." for n in _not_shown(missing))
            + (f" The first {SWEEP_JOBS} jobs; {more} more are in the sweep table." if more > 0 else ""))
    return [section("similarity-sweep", f"Representational similarity across the sweep ({len(items)} runs)", items,
                    note)]


READER = KindReader("similarity", present=lambda f: meta(f.attrs) is not None, lines=lines, sections=sections,
                    sweep=sweep_sections, methods={"similarity": read_similarity}, figures=figures,
                    sweep_figures=sweep_figures)
