"""The report's sections of one run that every file can have: header, captures,
attention patterns. Each section is plain data (analysis/report/page.py draws it).

    sections = [header(run), *kind_sections(run), captures(run, budget), *attention(run, budget)]

Bounded whatever the file's size: statistics are exact (read block by block), but a histogram
is made of at most `budget.values` values from at most 8 blocks spread over the capture, and
maps and patterns are shown for the first samples only; the section says so.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from hookrun.analysis.gradcam import is_map  # (plot imports it from here too)
from hookrun.analysis.images import map_rows
from hookrun.analysis.kind_readers import asked, kind_units, unread_kind
from hookrun.analysis.report.colour_scales import sample_scale, to_rgb, without_mask_fill
from hookrun.analysis.report.figure_specs import (
    DIVERGING,
    SEQUENTIAL,
    Heatmap,
    constant_over_space,
    diverging_range,
    finite_range,
    histogram_of,
    is_signed,
    no_value_note,
    skip_reason,
    value_label,
)
from hookrun.analysis.report.plotly_figures import to_plotly
from hookrun.analysis.report.token_text import token_text
from hookrun.analysis.run_notes import run_status, weights_note
from hookrun.analysis.stats import human_bytes, no_values
from hookrun.errors import dataset_label
from hookrun.store import PATTERN
from hookrun.text_labels import natural_key


@dataclass
class Budget:
    values: int = 200_000  # values per histogram
    samples: int = 2  # samples of maps and attention patterns
    channels: int = 16  # channels (or heads) per sample
    features: int = 256  # latents listed per module


def section(sid: str, title: str, items: list[dict], note: str = "") -> dict:
    return {"id": sid, "title": title, "items": items, "note": note}


def figure(spec: Any, caption: str = "") -> dict:
    return {"type": "figure", "figure": to_plotly(spec), "caption": caption}


# Root attributes that are the file's own bookkeeping, not what the user set nor what the run did.
INTERNAL = {"previous_flush", "format_version", "config", "hooks_not_fired", "hooks_skipped", "checksum"}  # (JSON attributes: below)


def header(run: Any) -> dict:
    """The run's table: what the user set (model, mode, data, hooks, the run's block) and what the
    run did (status, rows, times, and what its kind's reader says); the whole config below it. The
    file's bookkeeping (previous_flush, format_version, JSON attributes) stays out: `inspect` prints it."""
    a, cfg = run.attrs, run.config
    hooks = cfg.get("hooks") or {}
    readers = run.kind_readers()
    steps, rows_name = kind_units(readers)
    done = f"{a.get('samples_complete', '?')} {rows_name} in {a.get('steps_complete', '?')} {steps}"
    rows = [["file", str(run.path)], ["status", run_status(run)],
            ["model", " ".join(str(p) for p in (a.get("model_class"), a.get("device") and f"on {a['device']}",
                                                weights_note(cfg) and f"({weights_note(cfg)})") if p) or "?"],
            ["mode", str(cfg.get("mode", a.get("mode", "?")))],
            ["data", f"{dataset_label((cfg.get('data') or {}).get('dataset'))}, batch {(cfg.get('data') or {}).get('batch_size', '?')}"],
            ["done", done],
            ["started", str(a.get("created", "?"))], ["finished", str(a.get("finished", "(not finished)"))],
            ["written by", " ".join(f"{k} {a[v]}" for k, v in (("hookrun", "hookrun_version"), ("torch", "torch_version")) if v in a)]]
    if _seconds(a) is not None:
        rows.append(["wall time", f"{_seconds(a):.0f} s (started .. finished)"])
    rows += [[f"hook {name}", f"{spec.get('type')} at {spec.get('at')}: {_actions(spec)}"] for name, spec in hooks.items()]
    for key, what in (("hooks_not_fired", "hooks that never fired"), ("hooks_skipped", "hooks skipped")):
        if str(a.get(key, "") or ""):
            rows.append([what, str(a[key])])
    note = None if readers else unread_kind(run.file.attrs)  # (a plugin's kind not installed here: as inspect says)
    rows += [["kind", note]] if note else [row for r in readers for row in asked(r, "header", a)]
    shown = {"model_class", "device", "samples_complete", "steps_complete", "created", "finished", "hookrun_version", "torch_version",
             "mode", "status", *INTERNAL, *(["kind"] if note else [])}
    for k, v in sorted(a.items()):
        text = str(v.tolist() if isinstance(v, np.ndarray) else v)
        if k not in shown and not isinstance(v, np.ndarray) and text not in ("", "None") and not text.lstrip().startswith(("{", "[")):
            rows.append([k.replace("_", " "), text])
    items = [{"type": "kv", "rows": rows}]
    if cfg:
        items.append({"type": "pre", "title": "config", "text": yaml.safe_dump(cfg, sort_keys=False)})
    return section("header", "Run", items)


def _seconds(a: dict) -> float | None:
    from datetime import datetime

    try:
        start, end = (datetime.strptime(str(a[k]), "%Y-%m-%dT%H:%M:%S%z") for k in ("created", "finished"))
    except (KeyError, ValueError):
        return None
    return (end - start).total_seconds()


def _actions(spec: dict) -> str:
    return ", ".join(a if isinstance(a, str) else str(a.get("name", a)) for a in spec.get("actions") or [])


def table_item(columns: list[str], rows: list[dict]) -> dict:
    return {"type": "table", "columns": columns, "rows": [[_cell(r.get(c)) for c in columns] for r in rows]}


def _cell(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float):
        return float(f"{v:.6g}") if np.isfinite(v) else str(v)
    return v if isinstance(v, int | str | bool) or v is None else str(v)


def sampled_rows(ds: Any, values: int, blocks: int = 8) -> tuple[np.ndarray, str]:
    """At most `values` values of a dataset's rows, read as up to `blocks` contiguous blocks spread
    evenly over it; and a note saying how many rows that is (empty when all were read)."""
    n = ds.shape[0]
    spans = row_blocks(ds.shape, values, blocks)
    if len(spans) == 1 and len(spans[0]) == n:
        return np.asarray(ds[:], dtype=np.float64), ""
    rows = np.concatenate([np.asarray(ds[r.start : r.stop], dtype=np.float64) for r in spans])
    return rows, f"a sample of {len(rows)} of {n} rows, in {len(spans)} blocks"


def row_blocks(shape: tuple, values: int, blocks: int = 8) -> list[range]:
    """The rows sampled_rows reads of a dataset of `shape`: one range of every row, or up to
    `blocks` contiguous ranges spread evenly over them."""
    n = shape[0]
    per_row = max(1, int(np.prod(shape[1:], dtype=np.int64)))
    want = max(1, min(n, values // per_row))
    if want >= n:
        return [range(0, n)]
    blocks = min(blocks, want)
    size = want // blocks
    return [range(int(s), int(s) + size) for s in np.linspace(0, n - size, blocks).astype(int)]


def is_pattern(info: Any) -> bool:
    return info.rows == "samples" and tuple(info.dims[1:]) == PATTERN


NONFINITE = "NaN or inf (left out)"


def captures(run: Any, budget: Budget) -> dict:
    """The captures' table, a histogram of each capture whose values make a distribution, and
    thumbnails of image maps; the section's note says in one line what was left out and why."""
    shown = sorted((c for c in run.captures if not c.role.startswith(("top.", "lens."))), key=lambda c: natural_key(c.label))  # (by depth)
    rows, left, empty = [], LeftOut(), set()
    for c in shown:
        s = run.capture_stats(c)
        nonfinite = s["nonfinite"]  # beside finite values; a capture with none has its note instead
        if not np.isfinite(s["min"]):  # never "nan, inf, -inf": the note says why there is nothing
            left.add(c.label, no_values(c.label, s))
            empty.add(c.label)
            s, nonfinite = dict.fromkeys(("mean", "std", "min", "max", "zeros")), None
        rows.append({"capture": c.label, "shape": str(c.shape), "dims": ", ".join(c.dims), "dtype": c.dtype,
                     "size": human_bytes(c.nbytes), **{k: s[k] for k in ("mean", "std", "min", "max", "zeros")},
                     NONFINITE: nonfinite})
    columns = ["capture", "shape", "dims", "dtype", "size", "mean", "std", "min", "max", "zeros"]
    if any(r[NONFINITE] for r in rows):  # the statistics are of the finite values: say how many were not
        columns.append(NONFINITE)
    items = [table_item(columns, rows)]
    hists, maps = [], []
    for c in shown:
        ds = run.file[c.path]
        if ds.dtype == object or not ds.shape[0] or c.label in empty:
            continue
        why, spec = skip_reason(c, ds), None
        if why is None:
            values, note = sampled_rows(ds, budget.values)
            if values.size > budget.values:  # one row holds more than --values: evenly spaced values of it
                flat = values.reshape(-1)
                values = flat[np.linspace(0, flat.size - 1, budget.values).astype(np.int64)]
                note = f"{budget.values} evenly spaced values of 1 of {ds.shape[0]} rows ({flat.size} values a row)"
            spec = histogram_of(values, c.label, value_label(c.role), note)
            why = None if spec is not None else "no finite value"
        if why:
            left.add(f"histogram of {c.label}", why)
        else:
            hists.append(figure(spec))
        if is_map(c):
            thumbs = thumbnails(run, c, budget)
            if thumbs is None:
                left.add(f"maps of {c.label}", "each channel is one value over space (a gradient after global pooling)")
            else:
                maps.append(thumbs)
    if hists:
        items.append({"type": "figures", "title": "histograms of the values", "figures": hists})
    return section("captures", "Captures", items + maps, left.note())


class LeftOut:
    """What a picture set left out, grouped by reason, said in one line."""

    def __init__(self) -> None:
        self.why: dict[str, list[str]] = {}

    def add(self, what: str, why: str) -> None:
        self.why.setdefault(why, []).append(what)

    def lines(self) -> list[str]:
        out = []
        for why, whats in self.why.items():
            named = ", ".join(whats[:3]) + (f" and {len(whats) - 3} more" if len(whats) > 3 else "")
            out.append(f"not drawn: {named}: {why}")
        return out

    def note(self) -> str:
        return "; ".join(self.lines())


def thumbnails(run: Any, info: Any, budget: Budget) -> dict | None:
    """The first samples' maps as images (None where every channel is constant over space). Maps
    of both signs use the diverging scale centred on 0, others the sequential one."""
    rows = map_rows(run, info, budget.samples)[:, : budget.channels]  # (channels first, however stored)
    if constant_over_space(rows):
        return None
    index = run.index(info.hook, info.module, info.role, call=info.call)
    signed = is_signed(rows)
    lo, hi = diverging_range(rows) if signed else finite_range(rows)  # (of the finite values: an inf is a grey cell)
    images = [{"src": png(m, lo, hi, signed=signed), "caption": f"#{index[s]} ch {c}"} for s, sample in enumerate(rows) for c, m in enumerate(sample)]
    scale = f"diverging, centred on 0, {lo:.3g} .. {hi:.3g}: positive red" if signed else f"{lo:.3g} .. {hi:.3g}"
    weights = f"{weights_note(run.config)}, " if weights_note(run.config) else ""
    return {"type": "images", "title": f"{info.label}: feature maps ({weights}first {len(rows)} samples, channels 0-{rows.shape[1] - 1}; "
                                        f"one colour scale, {scale}){no_value_note(rows)}", "images": images}


def png(m: np.ndarray, lo: float, hi: float, size: int = 64, signed: bool = False) -> str:
    """One map as a PNG data URI (the sequential scale, or the diverging one; a NaN or inf cell grey), scaled up to about
    `size` pixels (nearest neighbour)."""
    from matplotlib import colormaps
    from matplotlib.colors import LinearSegmentedColormap
    from PIL import Image

    cmap = LinearSegmentedColormap.from_list("hookrun_diverging", list(DIVERGING)) if signed else colormaps[SEQUENTIAL]
    rgb = (to_rgb(m, lo, hi, cmap) * 255).astype(np.uint8)  # (a NaN or inf cell: NO_VALUE, never a colour of the scale)
    k = max(1, size // max(m.shape))
    buf = io.BytesIO()
    Image.fromarray(rgb).resize((m.shape[1] * k, m.shape[0] * k), Image.NEAREST).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def attention(run: Any, budget: Budget) -> list[dict]:
    """Each attention capture: a heatmap per head for the first samples, the tokens on both axes."""
    items = []
    for c in (c for c in run.captures if is_pattern(c)):
        ds = run.file[c.path]
        index = run.index(c.hook, c.module, c.role, call=c.call)
        for r in range(min(budget.samples, ds.shape[0])):
            m = without_mask_fill(ds[r], (ds.attrs.get("torch_dtype"), ds.dtype))  # (a mask's fill, -3.4e38: grey, no value)
            keep, text = token_text(run, int(index[r]), m.shape[-1])
            offset = m.shape[-1] - m.shape[-2]
            queries = np.arange(m.shape[-2]) if keep is None else keep[keep >= offset] - offset
            keys = np.arange(m.shape[-1]) if keep is None else keep
            labels = text if text is not None else [str(int(k)) for k in keys]
            qlabels = [labels[list(keys).index(q + offset)] for q in queries]
            heads = m[: budget.channels][:, queries][:, :, keys]
            scale, centre, bar = sample_scale(heads, c.role)  # (plot's rule too; scores diverging about 0)
            figs = [figure(Heatmap(heads[h], f"{c.label} · #{index[r]} · head {h}", x=labels, y=qlabels, xlabel="key",
                                   ylabel="query", label=c.role, bar_label=bar, range=scale, centre=centre)) for h in range(len(heads))]
            items.append({"type": "figures", "title": f"{c.label}: sample #{index[r]}", "figures": figs,
                          "key": {"capture": c.path, "row": r, "queries": queries.tolist(), "keys": keys.tolist()}})
    if not items:
        return []
    return [section("attention", "Attention patterns", items, f"the first {budget.samples} samples, at most {budget.channels} heads each")]
