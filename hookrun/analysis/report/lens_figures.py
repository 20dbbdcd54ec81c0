"""The logit lens' pictures, shared by `plot` and `report`: layer (hooked module) down, position
across, first the mean over every sample, then the first samples one by one.

    specs = lens_specs(run, samples=2)      # [Heatmap, ...]; empty where the run has no lens

Per layer and position: KL(final || lens) in nats, and the target's rank on a log scale
(log10(1 + rank): rank 0 is the top; one position such as `<bos>` where the target ranks in the
hundreds does not wash out the others' colours; in the mean picture log10(1 + the samples' mean rank)), and the target's log-probability. The rows are
the model's layers (`embed`, `L0`, `L1`, ...: layer_names); positions where no layer has a value
are left out, and the title counts those of padding in every sample apart from those with no
target (the last position has no next token). Each cell
names the lens' top-1 token (its text for byte tokens of data=text, its id otherwise); in the
mean picture, the top-1 token most samples share at that cell, counted over every sample. Padding (attention_mask 0) and
positions with no target (rank -1) are left out of the means.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hookrun.analysis.report.figure_specs import Heatmap
from hookrun.analysis.report.run_sections import figure, section
from hookrun.analysis.report.token_text import byte_label, is_byte_text, token_text
from hookrun.errors import module_label
from hookrun.text_labels import natural_key

ROLES = {  # role: (what the colour shows, how a value becomes a colour)
    "lens.kl_to_final": ("KL(final ‖ lens), nats", None),
    "lens.target_rank": ("target rank, log10(1 + rank)", "log"),
    "lens.target_logprob": ("target log-probability", None),
}
MEAN = {"lens.target_rank": "target rank, log10(1 + mean rank)"}  # the mean picture's colour: the log of the mean
BLOCK = 4096  # rows read at a time


def lens_infos(run: Any) -> dict[str, list[Any]]:
    """The lens captures of each role, one per hooked module, by depth (depth_order)."""
    infos = [c for c in run.captures if c.role.startswith("lens.") and c.rows == "samples"]
    order = depth_order(run, infos)
    by_role: dict[str, list] = {}
    for c in sorted(infos, key=lambda c: order[c.module]):
        by_role.setdefault(c.role, []).append(c)
    return by_role


def depth_order(run: Any, infos: list[Any]) -> dict[str, tuple]:
    """Each hooked module's place by depth. Where every lens capture has its checksum number (its
    `digest`, /checksums:K, numbered as the datasets are made): the order the run first wrote them,
    which is the order the hooked layers ran (each layer's lens is written when the unembed has run, in
    the order they fired). Else (output.checksum=false, a many-rank view) by name: an unnumbered
    module named as an embedding (`hook_embed`, `embed_tokens`, `wte`) first, then natural_key (the file
    lists its groups in text order: `blocks.0` before `hook_embed`, h.10 before h.2)."""
    fired: dict[str, int] = {}
    for c in infos:
        digest = str(run.file[c.path].attrs.get("digest", ""))
        k = int(digest.rpartition(":")[2]) if digest.startswith("/checksums:") and digest.rpartition(":")[2].isdigit() else None
        if k is None:
            fired = {}
            break
        fired[c.module] = min(k, fired.get(c.module, k))
    if fired:
        return {m: (k,) for m, k in fired.items()}
    embedding = lambda m: not any(p.isdigit() for p in m.split(".")) and any(e in m.rpartition(".")[2] for e in ("emb", "wte", "wpe"))  # noqa: E731
    return {c.module: (0 if embedding(c.module) else 1, natural_key(c.module)) for c in infos}


def _mask(run: Any, n: int, width: int) -> np.ndarray | None:
    s = run.file["samples"] if "samples" in run.file else {}
    if "attention_mask" in s and s["attention_mask"].shape == (n, width):
        return s["attention_mask"]
    return None


def _values(raw: np.ndarray, role: str) -> np.ndarray:
    v = np.asarray(raw, dtype=np.float64)
    if role == "lens.target_rank":
        v = np.where(v < 0, np.nan, v)  # -1: no target at this position
    return v


def mean_over_samples(run: Any, infos: list[Any], role: str) -> tuple[np.ndarray, int]:
    """(layers x positions) mean over every sample of one role (NaN where no sample has a value), and
    the number of samples. Read BLOCK rows at a time."""
    n, width = infos[0].shape[:2]
    mask = _mask(run, n, width)
    out = np.full((len(infos), width), np.nan)
    for k, info in enumerate(infos):
        total, count = np.zeros(width), np.zeros(width)
        ds = run.file[info.path]
        for lo in range(0, n, BLOCK):
            v = _values(ds[lo:lo + BLOCK], role)
            ok = np.isfinite(v) & (np.asarray(mask[lo:lo + BLOCK]) > 0 if mask is not None else True)
            total += np.where(ok, v, 0).sum(0)
            count += ok.sum(0)
        out[k] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return out, n


def _colour(z: np.ndarray, role: str) -> np.ndarray:
    return np.log10(1 + z) if ROLES[role][1] == "log" else z


def _label(run: Any) -> Any:
    return byte_label if is_byte_text(run.config) else str


def top1_common(run: Any, infos: list[Any]) -> list[list[str]] | None:
    """Per layer and position: the top-1 token most samples share (the lowest id among equals), as text;
    counted over every sample (padding left out), BLOCK rows at a time: (position, id) pairs and their counts."""
    if not infos:
        return None
    label = _label(run)
    n, width = infos[0].shape[:2]
    mask = _mask(run, n, width)
    cells = []
    for info in infos:
        ds, keys, counts = run.file[info.path], np.zeros(0, np.int64), np.zeros(0, np.int64)
        for lo in range(0, n, BLOCK):
            ids = np.asarray(ds[lo:lo + BLOCK, :, 0], dtype=np.int64)
            ok = np.asarray(mask[lo:lo + BLOCK]) > 0 if mask is not None else np.ones(ids.shape, bool)
            new, seen = np.unique(((np.arange(width, dtype=np.int64)[None, :] << _ID_BITS) + ids)[ok], return_counts=True)
            keys, where = np.unique(np.concatenate([keys, new]), return_inverse=True)
            counts = np.bincount(where, weights=np.concatenate([counts, seen]), minlength=len(keys)).astype(np.int64)
        pos, tok = keys >> _ID_BITS, keys & ((1 << _ID_BITS) - 1)
        order = np.lexsort((tok, -counts, pos))  # by position, then most samples first, then the lowest id
        first = order[np.r_[True, pos[order][1:] != pos[order][:-1]]] if len(order) else order
        row = [""] * width
        for k in first:
            row[int(pos[k])] = label(int(tok[k]))
        cells.append(row)
    return cells


_ID_BITS = 40  # a (position, token id) pair as one integer: position << _ID_BITS | id


def layer_names(modules: list[str]) -> list[str]:
    """The lens' rows as the model's layers: a block of a numbered stack (`transformer.h.3`,
    `model.layers.3`) is `L3` (a part of one, `L3.attn`), a module before every block (the
    embeddings' output, `transformer.drop`) is `embed`, any other keeps its name."""
    out, seen_block = [], False
    for m in modules:
        parts = str(m).split(".")
        numbered = [i for i, p in enumerate(parts) if p.isdigit()]
        if numbered:
            i = numbered[-1]
            out.append(".".join([f"L{parts[i]}", *parts[i + 1:]]))
            seen_block = True
        else:
            out.append("embed" if not seen_block else module_label(m))
    return out if len(set(out)) == len(out) else [module_label(m) for m in modules]


def _targetless(z: np.ndarray) -> np.ndarray:
    """The positions (columns) where no layer has a value: no target there (the last position has no next token)."""
    return ~np.isfinite(z).any(0)


def _padding(run: Any, n: int, width: int) -> np.ndarray:
    """The positions (columns) that are padding (attention_mask 0) in every sample."""
    mask, real = _mask(run, n, width), np.zeros(width, bool)
    for lo in range(0, n if mask is not None else 0, BLOCK):
        real |= (np.asarray(mask[lo:lo + BLOCK]) > 0).any(0)
    return ~real if mask is not None else real


def _without(note_cols: int, padding: int = 0) -> str:
    """The title's note on the columns left out: padding in every sample, and positions with no target."""
    parts = [f"{k} position{'s' if k > 1 else ''} {what}" for k, what in ((padding, "of padding in every sample"),
                                                                       (note_cols, "without a target")) if k]
    why = " (the last has no next token)" if note_cols else ""
    return f"; {' and '.join(parts)} left out{why}" if parts else ""


def lens_specs(run: Any, samples: int) -> list[Heatmap]:
    by_role = lens_infos(run)
    top = by_role.get("lens.top_ids")
    specs = []
    shown = [r for r in ROLES if r in by_role and len(by_role[r][0].shape) == 2]
    if not shown:
        return []
    common = top1_common(run, top) if top else None
    modules = [module_label(c.module) for c in by_role[shown[0]]]
    layers = layer_names(modules)
    ylabel = f"layer (embed: {modules[0]})" if layers[0] == "embed" else "layer"
    for role in shown:
        z, n = mean_over_samples(run, by_role[role], role)
        gone = _targetless(z)  # a target's roles have no value at the last position: that column is left out
        keep = np.flatnonzero(~gone) if gone.any() and not gone.all() else np.arange(z.shape[1])
        padded = int((gone & _padding(run, n, z.shape[1])).sum()) if len(keep) < z.shape[1] else 0
        cells = [[row[p] for p in keep] for row in common] if common is not None else None
        what = MEAN.get(role, ROLES[role][0])
        specs.append(Heatmap(_colour(z[:, keep], role), f"logit lens · {what} · mean over {n} samples (top-1 token in each cell: "
                             f"the most common){_without(z.shape[1] - len(keep) - padded, padded)}", x=[str(int(p)) for p in keep], y=layers,
                             xlabel="position", ylabel=ylabel, label=what, cells=cells))
    first = by_role[shown[0]][0]
    index = run.index(first.hook, first.module, first.role, call=first.call)
    label = _label(run)
    for r in range(min(samples, len(index))):
        ids = np.stack([np.asarray(run.file[c.path][r, :, 0]) for c in top]) if top else None
        for role in shown:
            z = np.stack([_values(run.file[c.path][r], role) for c in by_role[role]])
            keep, text = token_text(run, int(index[r]), z.shape[1])
            cols = keep if keep is not None else np.arange(z.shape[1])
            names = list(text) if text else [str(int(p)) for p in cols]
            gone = _targetless(z[:, cols])
            if gone.any() and not gone.all():
                cols, names = cols[~gone], [t for t, g in zip(names, gone, strict=True) if not g]
            cells = [[label(int(ids[k, p])) for p in cols] for k in range(len(ids))] if ids is not None else None
            specs.append(Heatmap(_colour(z[:, cols], role), f"logit lens · {ROLES[role][0]} · sample #{index[r]} (top-1 token in each cell)"
                                 f"{_without(int(gone.sum()) if not gone.all() else 0)}",
                                 x=names, y=layers, xlabel="position (input token)",
                                 ylabel=ylabel, label=ROLES[role][0], cells=cells))
    return specs


def lens(run: Any, budget: Any) -> list[dict]:
    """The report's "Logit lens" section (empty where the run has no lens)."""
    items = [figure(spec) for spec in lens_specs(run, budget.samples)]
    note = f"the mean over every sample, then the first {budget.samples} samples one by one"
    return [section("lens", "Logit lens", items, note)] if items else []


def lens_pictures(run: Any, samples: int) -> list[tuple[str, Heatmap]]:
    """plot's pictures: (file stem `lens_K_WHAT_SAMPLE`, spec) of each lens_specs heatmap."""
    out = []
    for k, spec in enumerate(lens_specs(run, samples)):
        parts = spec.title.split(" · ")
        what = parts[1].split(",")[0].split("(")[0].strip().replace(" ", "_")
        out.append((f"lens_{k}_{what}_{parts[2].split(' (')[0].replace(' ', '_').replace('#', '')}", spec))
    return out
