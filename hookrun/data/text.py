"""Text, tokenized offline: local .txt / .jsonl files or a `datasets` save_to_disk folder.

    ds = text()                                   # the sample text shipped with hookrun, byte tokens
    ds = text(files=["a.txt"], tokenizer="tok/", max_length=64, padding_side="left")
    ds[0]  # {"input_ids": LongTensor(max_length), "attention_mask": LongTensor(max_length)}

A .txt file gives one sample per non-empty line, a .jsonl file one per line (its `field`), a
folder saved with `datasets.Dataset.save_to_disk` one per row (files are UTF-8, a byte-order mark
dropped; a .json, .csv or compressed file is refused); `files: pydoc_topics` the lines of
the Python reference's English prose that every CPython has. `tokenizer: byte` needs no files
(ids 0-2 are pad, bos, eos; byte b is b + 3); a folder is read with transformers'
AutoTokenizer (local_files_only). Every sample is cut to `max_length` and padded to it
(`padding: max_length`) or to the dataset's longest sample (`padding: longest`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from hookrun.data import whole
from hookrun.errors import ConfigError

SAMPLE = Path(__file__).with_name("sample.txt")
PYDOC = "pydoc_topics"  # files: pydoc_topics reads the English text every Python install has
# files that are not a sample per line (a JSON document, a table, compressed or binary data)
NOT_LINES = {".json", ".csv", ".tsv", ".parquet", ".arrow", ".feather", ".gz", ".bz2", ".xz", ".zst", ".zip", ".tar", ".pkl", ".npy"}


class ByteTokenizer:
    """Bytes as tokens, no files: `decode(encode(s)) == s`.

    tok = ByteTokenizer(); tok.encode("hi")  # [1, 107, 108]  (bos, then byte + 3)
    """

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    offset = 3
    vocab_size = 256 + offset

    def __init__(self, add_bos: bool = True, padding_side: str = "right") -> None:
        if padding_side not in ("left", "right"):
            raise ConfigError(f"data.dataset.padding_side={padding_side!r}; choose left or right")
        self.add_bos, self.padding_side = add_bos, padding_side

    def encode(self, text: str) -> list[int]:
        return ([self.bos_token_id] if self.add_bos else []) + [b + self.offset for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        data = bytes(i - self.offset for i in ids if i >= self.offset)
        return data.decode("utf-8", errors="replace")

    def __call__(self, texts: list[str], max_length: int, padding: str = "max_length") -> dict[str, torch.Tensor]:
        """Token ids and attention masks of `texts`, cut to `max_length` and padded."""
        ids = [self.encode(t)[:max_length] for t in texts]
        width = max_length if padding == "max_length" else max(map(len, ids))
        return pad(ids, width, self.pad_token_id, self.padding_side)


def pad(ids: list[list[int]], width: int, pad_id: int, side: str) -> dict[str, torch.Tensor]:
    out = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        sl = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        out[i, sl] = torch.tensor(row, dtype=torch.long)
        mask[i, sl] = 1
    return {"input_ids": out, "attention_mask": mask}


class TextDataset(Dataset):
    """Tokenized texts; items are {input_ids, attention_mask} of one length."""

    def __init__(self, texts: list[str], encoded: dict[str, torch.Tensor], tokenizer: Any) -> None:
        self.texts, self.encoded, self.tokenizer = texts, encoded, tokenizer

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.encoded.items()}


def text(files: str | list[str] | None = None, tokenizer: str = "byte", max_length: int = 32,
         padding: str = "max_length", padding_side: str = "right", field: str = "text",
         limit: int | None = None, start: int = 0) -> TextDataset:
    """The dataset of data=text (see the module docstring); `files: null` reads the shipped sample."""
    if padding not in ("max_length", "longest"):
        raise ConfigError(f"data.dataset.padding={padding!r}; choose max_length or longest")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:  # (True was 1 token)
        raise ConfigError(f"data.dataset.max_length={max_length!r}; expected a whole number >= 1")
    whole("start", start, 0)  # (a negative start took the last texts, as Python's slices do)
    if limit is not None:
        whole("limit", limit, 1)
    names = [SAMPLE] if files is None else ([files] if isinstance(files, str) else list(files))
    if not names:
        raise ConfigError("data.dataset.files=[] names no file; give files (a .txt, .jsonl or datasets folder), or "
                          "null for the sample text shipped with hookrun")
    paths = [n if isinstance(n, Path) or n == PYDOC else Path(n).expanduser() for n in names]
    texts = [t for p in paths for t in (pydoc_lines() if p == PYDOC else read_texts(p, field))]
    held = len(texts)
    texts = texts[start:None if limit is None else start + limit]  # `start`: skip the first texts (a held-out part)
    if not texts:
        where = f"data.dataset.files: {', '.join(map(str, paths))} {'holds' if len(paths) == 1 else 'hold'}"
        raise ConfigError(f"{where} no text" if not held else
                          f"data.dataset.start={start}: past the end: {where} {held} text(s); give a start below {held}")
    tok = load_tokenizer(tokenizer, padding_side)
    if isinstance(tok, ByteTokenizer):
        encoded = tok(texts, max_length, padding)
    else:
        enc = tok(texts, max_length=max_length, truncation=True, padding=padding, return_tensors="pt")
        encoded = {"input_ids": enc["input_ids"].long(), "attention_mask": enc["attention_mask"].long()}
    return TextDataset(texts, encoded, tok)


def pydoc_lines() -> list[str]:
    """`files: pydoc_topics`: the non-empty lines of the Python reference's prose that ships with
    every CPython (pydoc_data/topics.py, ~465,000 characters; model=tiny_lm was trained on it)."""
    from pydoc_data.topics import topics

    return [line.strip() for key in sorted(topics) for line in topics[key].splitlines() if len(line.strip()) > 1]


def read_texts(path: Path, field: str) -> list[str]:
    if path.is_dir():
        try:
            import datasets
        except ImportError:
            raise ConfigError("a datasets folder needs the datasets package: pip install 'hookrun[hf]'") from None
        try:
            ds = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError) as exc:
            raise ConfigError(f"data.dataset.files: {str(path)!r} is not a folder saved with save_to_disk: {exc}") from None
        if isinstance(ds, datasets.DatasetDict):  # (its column_names are per split: the splits were named as columns)
            splits = list(ds)
            raise ConfigError(f"data.dataset.files: {str(path)!r} holds the splits {', '.join(splits)} (a DatasetDict); "
                              f"give one split's folder, e.g. {str(path / splits[0])!r}")
        if field not in ds.column_names:
            raise ConfigError(f"data.dataset.field={field!r}: {str(path)!r} has columns {', '.join(ds.column_names)}")
        values = ds[field]
        bad = next((i for i, t in enumerate(values) if not isinstance(t, str)), None)
        if bad is not None:
            raise ConfigError(f"data.dataset.field={field!r}: {str(path)!r} row {bad} holds {type(values[bad]).__name__} "
                              f"{values[bad]!r}, not text; give a column of strings")
        return list(values)
    if not path.is_file():
        raise ConfigError(f"data.dataset.files: no file {str(path)!r}")
    if path.suffix.lower() in NOT_LINES:  # (read as lines, their syntax became the samples' text)
        raise ConfigError(f"data.dataset.files: {str(path)!r} is a {path.suffix} file, which is not read as text lines; "
                          f"give a .txt file (a sample per line), a .jsonl file (a JSON object per line, its "
                          f"data.dataset.field) or a folder saved with datasets' save_to_disk")
    # lines end at "\n" (or "\r\n") only: universal newlines would end one at a lone "\r", str.splitlines also
    # at U+2028, U+2029, \x0b, \x1c..\x1e and \x85, splitting a sample and a JSON string in two; utf-8-sig drops
    # a byte-order mark at the file's start (Windows editors write one), which became the first sample's first bytes
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            lines = [line.removesuffix("\r") for line in fh.read().split("\n")]
    except UnicodeDecodeError as exc:
        raise ConfigError(f"data.dataset.files: {str(path)!r} is not UTF-8 text (byte {exc.start}); give a .txt or "
                          f".jsonl file in UTF-8") from None
    if path.suffix.lower() == ".jsonl":
        out = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"data.dataset.files: {str(path)!r} line {n} is not JSON: {exc.msg}") from None
            if not isinstance(row, dict) or field not in row:
                raise ConfigError(f"data.dataset.field={field!r}: {str(path)!r} line {n} has no such key")
            if not isinstance(row[field], str):
                raise ConfigError(f"data.dataset.field={field!r}: {str(path)!r} line {n} holds {json.dumps(row[field])}, "
                                  f"not text; give each line a string under {field!r}")
            out.append(row[field])
        return out
    return [line for line in lines if line.strip()]


def load_tokenizer(name: str, padding_side: str) -> Any:
    if name == "byte":
        return ByteTokenizer(padding_side=padding_side)
    folder = Path(name).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"data.dataset.tokenizer: no folder {str(folder)!r}; give a tokenizer folder "
                          f"(save_pretrained) or tokenizer=byte, which needs no files")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError("a tokenizer folder needs transformers: pip install 'hookrun[hf]'") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"data.dataset.tokenizer: {str(folder)!r} cannot be read: {str(exc).splitlines()[0]}") from None
    tok.padding_side = padding_side
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    if tok.pad_token is None:
        raise ConfigError(f"data.dataset.tokenizer: {str(folder)!r} has no pad, eos or unk token to pad the texts with; "
                          f"set \"pad_token\" in its special_tokens_map.json (or tokenizer=byte)")
    return tok
