"""Reading top_examples' captures: each feature's k largest activations, with their tokens.

    run = open_run("outputs/sae_eval/captures.h5")
    run.top_example_modules                 # {"transformer.h.3.sae.latents": 512}
    run.top_examples("transformer.h.3.sae.latents", 7)[0]
    # {"value": 4.2, "sample": 17, "position": 9, "context": ["t", "h", "e", ...], "at": 5}

`context` holds the texts of the real tokens around the position (the action's `context` on each
side, from /samples/input_ids: data=text's byte tokens as characters, other ids as numbers) and
`at` the index of the activating token in it; both are None where a row has no position (an
image's channel, a (batch, feature) tensor) or the file holds no input_ids.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np

from hookrun.data.text import ByteTokenizer
from hookrun.errors import NotFoundError, close_matches
from hookrun.store import CaptureMeta, RowKind
from hookrun.store.listing import is_capture

VALUES = "top.values"


def top_captures(f: h5py.File) -> dict[str, h5py.Dataset]:
    """module -> its top.values dataset (the first hook's, where several hooks keep top examples)."""
    found: dict[str, h5py.Dataset] = {}

    def visit(name: str, obj: Any) -> None:
        if is_capture(obj) and str(obj.attrs.get("role")) == VALUES and str(obj.attrs.get("rows")) == RowKind.FEATURES.value:
            found.setdefault(str(obj.attrs["module"]), obj)

    if "captures" in f:
        f["captures"].visititems(visit)
    return found


def top_example_modules(f: h5py.File) -> dict[str, int]:
    return {m: int(ds.shape[0]) for m, ds in sorted(top_captures(f).items())}


def top_examples(f: h5py.File, module: str, feature: int, byte_tokens: bool) -> list[dict]:
    found = top_captures(f)
    if module not in found:
        hint = close_matches(module, found) or sorted(found)[:10]
        raise NotFoundError(f"{f.filename} has no top examples of {module!r}; "
                            f"{'closest' if close_matches(module, found) else 'it has'}: {', '.join(hint) or 'none'}")
    values = found[module]
    n = values.shape[0]
    if isinstance(feature, bool) or not isinstance(feature, int | np.integer) or not 0 <= feature < n:
        raise NotFoundError(f"top_examples({module!r}, {feature!r}): {module} has features 0..{n - 1}")
    group = values.parent
    meta = CaptureMeta.from_attrs(values.attrs)
    context = int(meta.extra.get("context", 0))
    vals = values[feature]
    samples = group["top.samples"][feature]
    positions = group["top.positions"][feature]
    texts = _Texts(f, byte_tokens)
    out = []
    for v, s, p in zip(vals.tolist(), samples.tolist(), positions.tolist(), strict=True):
        if s < 0:
            continue
        ctx, at = texts.around(int(s), int(p), context) if p >= 0 else (None, None)
        out.append({"value": float(v), "sample": int(s), "position": int(p) if p >= 0 else None,
                    "context": ctx, "at": at})
    return out


class _Texts:
    """The tokens of a sample by its dataset index, from /samples/input_ids (and attention_mask)."""

    def __init__(self, f: h5py.File, byte_tokens: bool) -> None:
        s = f["samples"]
        self.ids = s["input_ids"] if "input_ids" in s and s["input_ids"].ndim == 2 else None
        self.mask = s["attention_mask"] if "attention_mask" in s and self.ids is not None and \
            s["attention_mask"].shape == self.ids.shape else None
        self.rows = {int(v): r for r, v in enumerate(s["index"][:])} if self.ids is not None else {}
        self.byte = byte_tokens

    def around(self, sample: int, position: int, context: int) -> tuple[list[str] | None, int | None]:
        r = self.rows.get(sample)
        if r is None or position >= self.ids.shape[1]:
            return None, None
        ids = self.ids[r]
        real = self.mask[r].astype(bool) if self.mask is not None else np.ones(len(ids), dtype=bool)
        lo, hi = max(0, position - context), min(len(ids), position + context + 1)
        keep = [i for i in range(lo, hi) if real[i] or i == position]
        return [self.label(int(ids[i])) for i in keep], keep.index(position)

    def label(self, token: int) -> str:
        if not self.byte:
            return str(token)
        tok = ByteTokenizer()
        if not tok.offset <= token < tok.offset + 256:
            return {tok.pad_token_id: "<pad>", tok.bos_token_id: "<bos>", tok.eos_token_id: "<eos>"}.get(token, f"<{token}>")
        return bytes([token - tok.offset]).decode("utf-8", errors="replace")
