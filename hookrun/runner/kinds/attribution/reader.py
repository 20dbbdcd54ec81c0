"""An attribution run's rows as labelled arrays (xarray), from its file alone.

    run.attribution()             # DataArray (sample, channel, height, width) or (sample, position, feature)
    run.attribution("deletion")   # DataArray (sample, fraction): the target's probability per step

The attribution carries per-sample coordinates: `target` (the class attributed), `logit` and `prob`
(the model's, for that class), `delta` (integrated gradients' convergence delta) and the curves'
areas (`deletion_area`, `insertion_area`) where the run measured them; its attributes are the
block as run (the file's root attribute `attribution`, JSON).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from hookrun.analysis.kind_readers import KindReader
from hookrun.error_words import json_attribute
from hookrun.errors import NotFoundError
from hookrun.store import CaptureMeta
from hookrun.store.listing import row_index

SCALARS = ("target", "logit", "prob", "delta", "deletion_area", "insertion_area", "deletion_random_area",
           "insertion_random_area")
CURVES = ("deletion", "insertion", "deletion_random", "insertion_random")  # ..._random: pixels in a random order


def attribution_meta(attrs: Any) -> dict | None:
    """The run's `attribution` root attribute, or None where it was no attribution run."""
    return json_attribute(attrs, "attribution")


def read_attribution(file: Any, which: str = "attribution") -> Any:
    import xarray as xr  # (imported here: hookrun imports without it)

    meta = attribution_meta(file.attrs)
    if meta is None:
        raise NotFoundError(f"{file.filename} is not an attribution run (no `attribution` attribute); runs with an "
                            f"attribution: block write one")
    if which not in ("attribution", *CURVES):
        raise NotFoundError(f"which={which!r}; choose attribution, {', '.join(CURVES[:-1])} or {CURVES[-1]}")
    group = f"captures/attribution/{_node(meta['at'])}"
    if which in CURVES and f"{group}/{which}" not in file:
        raise NotFoundError(f"{file.filename} holds no {which} curves: the run's attribution.measure did not ask for them")
    ds = file[f"{group}/{which}"]
    index = row_index(file, ds)
    coords: dict[str, Any] = {"sample": index}
    for name in SCALARS:
        if f"{group}/{name}" in file and which == "attribution":
            coords[name] = ("sample", file[f"{group}/{name}"][: len(index)])
    data = ds[:]
    if which in CURVES:
        dims = ("sample", "fraction")
        coords["fraction"] = np.linspace(0.0, 1.0, data.shape[1])
        coords["target"] = ("sample", file[f"{group}/target"][: len(index)])
    else:
        dims = tuple(_dims(ds, data.ndim))
    attrs = {k: (json.dumps(v) if isinstance(v, dict | list) else v) for k, v in meta.items() if v is not None}
    return xr.DataArray(data, dims=dims, coords=coords, name=which, attrs=attrs)


def _node(at: str) -> str:
    from hookrun.store.records import CaptureKey

    return CaptureKey("attribution", "" if at == "input" else at, "attribution", "x").path.split("/")[2]


def _dims(ds: Any, ndim: int) -> list[str]:
    names = list(CaptureMeta.from_attrs(ds.attrs).dims)
    return names if len(names) == ndim else ["sample", *[f"dim_{i}" for i in range(1, ndim)]]


def attribution_method(file: Any, which: str = "attribution") -> Any:
    """run.attribution(which): an attribution run's rows as an xarray.DataArray: `attribution`
    (sample, channel, height, width; or sample, position, feature) with target, logit, prob, delta and
    the curves' areas as coordinates; `deletion` / `insertion`: the curves (sample, fraction).
    docs/attribution.md."""
    return read_attribution(file, which)


def _columns(f: Any) -> dict[str, Any]:
    """A sweep table's numbers: the mean deletion and insertion areas where the run measured them."""
    meta = attribution_meta(f.attrs)
    group = f"captures/attribution/{_node(meta['at'])}"
    return {name: float(np.nanmean(f[f"{group}/{name}"][:])) for name in ("deletion_area", "insertion_area")
            if f"{group}/{name}" in f and f[f"{group}/{name}"].shape[0]}


def _sections(run: Any) -> list[dict]:
    from hookrun.runner.kinds.attribution.report import sections

    return sections(run)


def _sweep_sections(sweep: Any) -> list[dict]:
    from hookrun.runner.kinds.attribution.sweep_report import sweep_sections

    return sweep_sections(sweep)


def _figures(run: Any, samples: int | None = None) -> list[tuple[str, Any]]:
    from hookrun.runner.kinds.attribution.pictures import SAMPLES, figures

    return figures(run, SAMPLES if samples is None else samples)


READER = (KindReader("attribution", present=lambda f: "attribution" in f.attrs, columns=_columns,
                                    sections=_sections, sweep=_sweep_sections, methods={"attribution": attribution_method},
                                    figures=_figures))
