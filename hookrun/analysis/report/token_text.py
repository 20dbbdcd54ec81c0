"""The text of a run's tokens, from the file alone (a tokenizer folder is never loaded).

    keep, text = token_text(run, sample=0, width=32)   # real positions, one label each (or None)
    byte_label(3 + ord("a"))                           # 'a'

The labels exist where the run's config says its tokens are data=text's bytes; elsewhere the
pictures label positions with their numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hookrun.data.text import ByteTokenizer
from hookrun.text_labels import token_label


def token_text(run: Any, sample: int, width: int) -> tuple[np.ndarray | None, list[str] | None]:
    """(the real tokens' positions, their text) of one sample, from /samples/attention_mask and
    /samples/input_ids where the file has them with `width` positions; the text only where the
    run's config says the tokens are data=text's bytes."""
    s = run.file["samples"]
    rows = {int(v): r for r, v in enumerate(run.samples)}
    if sample not in rows:
        return None, None
    r = rows[sample]
    mask = s["attention_mask"][r] if "attention_mask" in s and s["attention_mask"].shape[1:] == (width,) else None
    keep = np.flatnonzero(mask) if mask is not None else np.arange(width)
    ids = s["input_ids"][r] if "input_ids" in s and s["input_ids"].shape[1:] == (width,) else None
    text = [byte_label(int(ids[p])) for p in keep] if ids is not None and is_byte_text(run.config) else None
    return (keep if mask is not None else None), text


def is_byte_text(config: dict) -> bool:
    data = (config.get("data") or {}).get("dataset") or {}
    return str(data.get("_target_", "")).startswith("hookrun.data.text") and data.get("tokenizer", "byte") == "byte"


def byte_label(token: int) -> str:
    """One byte token as a label: its character (whitespace made visible), <bos> and the like
    for special ids, \\xNN for a byte that is not a character alone."""
    tok = ByteTokenizer()
    special = {tok.pad_token_id: "<pad>", tok.bos_token_id: "<bos>", tok.eos_token_id: "<eos>"}
    if token in special or not tok.offset <= token < tok.offset + 256:
        return special.get(token, f"<{token}>")
    text = tok.decode([token])
    return f"\\x{token - tok.offset:02x}" if text == "\ufffd" else token_label(text)  # (a byte that is no character alone)
