"""A clean / corrupted task from the shipped text: the same window of a line, its last word swapped.

    ds = word_swap(n=32, length=40)
    ds[0]   # {"clean": (40,), "corrupt": (40,), "answer": (), "wrong": (), "position": ()}

Each item is a window of a line of English text (data=text's `pydoc_topics`, byte tokens: bos,
then byte + 3) that ends three letters into a word; the answer is that word's next byte. The
corrupted window is the same text with those three letters swapped for the first three of another
word, whose fourth letter is `wrong`: the model reads `answer` from the clean window and `wrong`
from the corrupted one, so a logit-difference grid shows where and in which layers the word's
letters are read. Both windows have `length` tokens, the same for every item.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import torch
from torch.utils.data import Dataset

from hookrun.data.text import PYDOC, ByteTokenizer, pydoc_lines, read_texts
from hookrun.errors import ConfigError

KEEP = 3  # letters of the last word inside the window


class SwapDataset(Dataset):
    def __init__(self, items: list[dict[str, torch.Tensor]], texts: list[tuple[str, str]]) -> None:
        self.items, self.texts, self.tokenizer = items, texts, ByteTokenizer()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def word_swap(files: str | list[str] = PYDOC, n: int = 32, length: int = 40, min_word: int = 5,
              seed: int = 0) -> SwapDataset:
    """`n` items of `length` byte tokens (module docstring)."""
    names = [files] if isinstance(files, str) else list(files)
    lines = [t for f in names for t in (pydoc_lines() if f == PYDOC else read_texts(Path(f).expanduser(), "text"))]
    words = sorted({w for line in lines[:2000] for w in re.findall(rf"\b[a-z]{{{min_word},}}\b", line)})
    rng = random.Random(seed)
    tok = ByteTokenizer()
    items, texts = [], []
    for line in lines:
        found = _item(line, words, length, min_word, rng)
        if found is None:
            continue
        clean, corrupt, answer, wrong = found
        ids = [torch.tensor([tok.bos_token_id] + [b + tok.offset for b in t.encode()]) for t in (clean, corrupt)]
        items.append({"clean": ids[0], "corrupt": ids[1], "answer": torch.tensor(ord(answer) + tok.offset),
                      "wrong": torch.tensor(ord(wrong) + tok.offset), "position": torch.tensor(length - 1)})
        texts.append((clean, corrupt))
        if len(items) == n:
            break
    if len(items) < n:
        raise ConfigError(f"data.dataset: word_swap found {len(items)} items of length {length} in the text, not n={n}; "
                          f"lower n or length")
    return SwapDataset(items, texts)


def _item(line: str, words: list[str], length: int, min_word: int, rng: random.Random) -> tuple[str, str, str, str] | None:
    if not line.isascii():
        return None
    for m in re.finditer(rf"\b[a-z]{{{min_word},}}\b", line):
        w, end = m.group(), m.start() + KEEP
        start = end - (length - 1)
        if start < 0:
            continue
        others = [o for o in words if o[:KEEP] != w[:KEEP] and o[KEEP] != w[KEEP]]
        other = rng.choice(others)
        clean = line[start:end]
        return clean, clean[:-KEEP] + other[:KEEP], w[KEEP], other[KEEP]
    return None
