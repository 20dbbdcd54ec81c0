"""The report's sections for what interpretability runs add: patching and attribution grids
and SAE latents (their top examples), read through the reader's API (the logit lens' pictures
are analysis/report/lens_figures.py).

    [*grids(run), *latents(run, budget)]   # empty lists where the file has none (the lens: lens_figures.py)

Grids come from `run.grids` / `run.grid(name)` (labelled arrays, dims ("module", *over)); latents from `run.top_example_modules` / `run.top_examples(module, feature)`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hookrun.analysis.report.channel_images import ChannelImages
from hookrun.analysis.report.figure_specs import (
    Circuit,
    Heatmap,
    Lines,
    Scatter,
    grid_title,
    histogram_of,
    metric_label,
)
from hookrun.analysis.report.run_sections import Budget, figure, sampled_rows, section


def grid_specs(run: Any) -> list[tuple[str, str, list[Any]]]:
    """(grid name, what it measured, specs) of every grid the file holds: a module x axis heatmap
    per plane, titled `site · method · metric` (the method from the file's patching attribute) and
    coloured around the unpatched run's metric (the corrupted run's when denoising, the clean
    run's when noising, 0 when normalised), and where exact values were recomputed (atp with
    verify), the estimate against them. An exact run has no estimate to compare: no scatter."""
    out = []
    for name in list(getattr(run, "grids", None) or []):
        g = run.grid(name)
        a = dict(g.attrs)
        about = ", ".join(f"{k} {_short(a[k])}" for k in ("metric", "method", "direction", "metric_clean", "metric_corrupt", "normalize") if k in a)
        base = 0.0 if a.get("normalize") else a.get("metric_clean" if a.get("direction") == "noise" else "metric_corrupt")
        specs: list[Any] = [Heatmap(z, grid_title(name, a, title), x=x, y=[str(m) for m in g.coords["module"].values], xlabel=xlabel,
                                    ylabel="module", label=metric_label(a), centre=_float(base))
                            for title, z, x, xlabel in _planes(g)]
        exact = _exact(run, name) if a.get("method", "exact") != "exact" else None
        if exact is not None:
            est, ex = np.asarray(g.values, dtype=np.float64).ravel(), np.asarray(exact.values, dtype=np.float64).ravel()
            done = np.isfinite(ex)
            labels = [", ".join(f"{d} {g.coords[d].values[i]}" for d, i in zip(g.dims, idx, strict=True))
                      for idx in zip(*np.unravel_index(np.flatnonzero(done), g.shape), strict=True)]
            if done.any():
                specs.append(Scatter(est[done], ex[done], f"estimate ({a.get('method', 'atp')}), {metric_label(a)}", "exact",
                                     f"{name}: {a.get('method', 'atp')} estimate against exact patching ({int(done.sum())} cells recomputed)",
                                     labels))
        specs += [_circuit(run, g), *_faithfulness(run)] if name == "edges" and "reader" in g.dims else []
        out.append((name, about, specs))
    return out


def grid_file_name(spec: Any, attrs: Any) -> str:
    """A grid picture's file stem: `grid_SITE_METHOD_METRIC` (two methods' pictures never share a name)."""
    site = " · ".join(spec.title.split(" · ")[:-2]) if isinstance(spec, Heatmap) else spec.title.split(":")[0]
    what = "" if isinstance(spec, Heatmap) else "_estimate_vs_exact"
    normalised = "_normalised" if "normalised" in metric_label(attrs) else ""
    return f"grid_{site}_{attrs.get('method', 'exact')}_{attrs.get('metric', 'value')}{normalised}{what}"


def _circuit(run: Any, g: Any, top: int = 30) -> Circuit:
    """The `top` edges of an edges run's [writer, reader] grid (dims module, reader) as a circuit: a node per
    component (a head's q/k/v readers are its node), embed at the bottom, each layer's heads then its MLP
    above, logits at the top."""
    from hookrun.analysis.grids import patching_meta

    graph = (patching_meta(getattr(run, "attrs", {})) or {}).get("graph") or {}
    writers, readers = graph.get("writers") or [], graph.get("readers") or []
    values = np.asarray(g.values, dtype=np.float64)
    node = lambda label: label.rsplit(".", 1)[0] if label.count(".") == 2 else label  # noqa: E731 (L0.H1.q -> L0.H1)
    names = list(dict.fromkeys([*map(node, writers), *map(node, readers)]))
    layers = 1 + max([int(n.split(".")[0][1:]) for n in names if n[0] == "L"] or [0])
    heads = 1 + max([int(n.split(".")[1][1:]) for n in names if ".H" in n] or [0])
    x, y = [], []
    for n in names:
        if n in ("embed", "logits"):
            x.append((heads - 1) / 2)
            y.append(0.0 if n == "embed" else 2.0 * layers + 1)
            continue
        layer, part = n.split(".")
        x.append(float(part[1:]) if part[0] == "H" else -1.0)
        y.append(2.0 * int(layer[1:]) + (1 if part[0] == "H" else 2))
    flat = np.where(np.isfinite(values), np.abs(values), -1.0).ravel()
    index = {n: i for i, n in enumerate(names)}
    edges = []
    for f in np.argsort(-flat, kind="stable")[:top]:
        if flat[f] < 0:
            break
        w, r = writers[f // len(readers)], readers[f % len(readers)]
        edges.append((index[node(w)], index[node(r)], float(values.ravel()[f]), f"{w} -> {r}"))
    return Circuit(names, x, y, edges[::-1], f"circuit: the top {len(edges)} edges by |score|")


def _faithfulness(run: Any) -> list[Any]:
    """An edges run's faithfulness curve (docs/edges.md): the recovered fraction against the edges kept."""
    from hookrun.analysis.grids import patching_meta

    curve = (patching_meta(getattr(run, "attrs", {})) or {}).get("faithfulness")
    if not curve:
        return []
    return [Lines(curve["k"], {"recovered": curve["recovered"]}, "edges kept (top k by |score|)", "recovered fraction",
                  f"faithfulness: {curve.get('ablation', 'corrupt')} ablation outside the top-k edges of {curve.get('from', '')}")]


def _short(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def grids(run: Any) -> list[dict]:
    items = [{"type": "figures", "title": f"{name}: {about}", "figures": [figure(s) for s in specs]}
             for name, about, specs in grid_specs(run)]
    return [section("grids", "Patching and attribution grids", items)] if items else []


def _exact(run: Any, name: str) -> Any:
    try:
        return run.grid(name, "exact")
    except (LookupError, KeyError, ValueError):
        return None


def _planes(g: Any) -> list[tuple[str, np.ndarray, list[str] | None, str]]:
    """(title suffix, module x axis values, axis labels, axis name) for each 2-D plane of a grid:
    the second axis across, one plane per index of the axes after it (at most 16)."""
    values = np.asarray(g.values, dtype=np.float64)
    if values.ndim == 1:
        return [("", values[:, None], None, "")]
    dim = g.dims[1]
    x = [str(v) for v in g.coords[dim].values] if dim in g.coords else None
    rest = values.shape[2:]
    planes = []
    for k, idx in enumerate(np.ndindex(*rest)):
        if k >= 16:
            break
        title = "".join(f" · {d} {g.coords[d].values[i] if d in g.coords else i}" for d, i in zip(g.dims[2:], idx, strict=True))
        planes.append((title, values[(slice(None), slice(None), *idx)], x, dim))
    return planes


def latents(run: Any, budget: Budget) -> list[dict]:
    """Per module with top examples: a searchable list of latents, each with its top examples
    (tokens, the activating one highlighted), its activation histogram (from a recorded capture
    of that module, where the file has one) and its decoder norm (where the file holds it)."""
    modules = dict(getattr(run, "top_example_modules", None) or {})
    items = []
    for module, n in modules.items():
        capture = _latent_capture(run, module)
        values, note = (None, "")
        if capture is not None:
            values, note = sampled_rows(run.file[capture.path], budget.values * 8)
            values = np.moveaxis(values, 1, -1) if values.ndim == 4 else values  # a map's features are its channels
            values = values.reshape(-1, values.shape[-1])
        norms = _decoder_norms(run, module)
        shown = min(n, budget.features)
        lookup = TokenActivations(run, capture) if capture is not None and capture.rows == "tokens" else None
        pictures = ChannelImages.of(run, capture)  # a conv layer's channels: their maps over the recorded images
        rows = []
        for f in range(shown):
            examples = run.top_examples(module, f)
            entry: dict[str, Any] = {"feature": f, "examples": [_example(e, lookup, f) for e in examples],
                                     "max": float(max((e["value"] for e in examples), default=0.0))}
            if pictures is not None:
                for ex in entry["examples"]:
                    ex["src"] = pictures.src(ex["sample"], f, entry["max"])
            hist = histogram_of(values[:, f], f"{module} latent {f}: activations", "activation", note) if values is not None and f < values.shape[1] else None
            if hist is not None:
                entry["hist"] = figure(hist)["figure"]
            if norms is not None and f < len(norms):
                entry["decoder_norm"] = float(norms[f])
            rows.append(entry)
        items.append({"type": "latents", "module": module, "features": rows,
                      "title": f"{module}: {n} latents" + (f" (the first {shown} listed)" if shown < n else "")})
    return [section("latents", "Latents", items)] if items else []


def _example(e: dict, lookup: TokenActivations | None, feature: int) -> dict:
    out = {"value": float(e["value"]), "sample": int(e["sample"]), "position": e.get("position"),
           "context": list(e["context"]) if e.get("context") is not None else None, "at": e.get("at")}
    if lookup is not None and out["context"] is not None and out["at"] is not None and out["position"] is not None:
        start = int(out["position"]) - int(out["at"])
        out["acts"] = lookup.values(out["sample"], range(start, start + len(out["context"])), feature)
    return out


class TokenActivations:
    """The activations of a token-row capture at (sample, position), read a few rows at a time:
    each context token of a top example gets its own value (None where the run kept no row)."""

    def __init__(self, run: Any, info: Any) -> None:
        f = run.file
        self.ds = f[info.path]
        n = self.ds.shape[0]
        sample, position = f["samples/token_sample"][:n].astype(np.int64), f["samples/token_position"][:n].astype(np.int64)
        self.width = int(position.max()) + 1 if n else 1
        keys = sample * self.width + position
        self.order = np.argsort(keys, kind="stable")
        self.keys = keys[self.order]

    def values(self, sample: int, positions: range, feature: int) -> list[float | None]:
        want = np.array([sample * self.width + p if 0 <= p < self.width else -1 for p in positions], dtype=np.int64)
        at = np.clip(np.searchsorted(self.keys, want), 0, max(len(self.keys) - 1, 0))
        found = (want >= 0) & (self.keys[at] == want) if len(self.keys) else np.zeros(len(want), bool)
        rows = np.where(found, self.order[at], -1)
        if not found.any():
            return [None] * len(want)
        lo, hi = int(rows[found].min()), int(rows[found].max())
        block = np.asarray(self.ds[lo : hi + 1, feature], dtype=np.float64)  # one read: the context's rows are together
        return [float(block[r - lo]) if r >= 0 else None for r in rows.tolist()]


def _latent_capture(run: Any, module: str) -> Any:
    """The recorded tensor the top examples were taken from: the same hook's output (a forward_pre
    hook's input) first, then any other capture of the module."""
    top = next((c for c in run.captures if c.module == module and c.role == "top.values"), None)
    role = "input" if top is not None and top.type == "forward_pre" else "output"
    found = [c for c in run.captures if c.module == module and not c.role.startswith(("top.", "lens.")) and len(c.shape) >= 2]
    found.sort(key=lambda c: (top is None or c.hook != top.hook, c.role != role))
    return found[0] if found else None


def _decoder_norms(run: Any, module: str) -> np.ndarray | None:
    """Each latent's decoder row norm |W_dec[f]|, where the run spliced an SAE at `module` (its
    latents are the module `MODULE.sae.latents`) and the SAE folder its config names is still
    there (SAELens' sae_weights.safetensors or sparsify's sae.safetensors: tensors only, nothing
    is built); None elsewhere."""
    from pathlib import Path

    for spec in (run.config.get("hooks") or {}).values():
        at = spec.get("at")
        for action in spec.get("actions") or []:
            if not isinstance(action, dict) or action.get("op") != "splice" or not isinstance(at, str):
                continue
            if module not in (at, f"{at}.sae.latents", f"{at}.sae"):
                continue
            folder = Path(str(action.get("path", "")))
            for name in ("sae_weights.safetensors", "sae.safetensors"):
                if (folder / name).is_file():
                    from safetensors.numpy import load_file

                    w = load_file(str(folder / name)).get("W_dec")
                    if w is not None:
                        return np.linalg.norm(np.asarray(w, dtype=np.float64), axis=1)
    return None
