"""MIB's task data, as its data sets publish their rows, made into patching items; and IOI rows to test with.

    rows = ioi_rows(n=8, seed=0)                         # rows of MIB's IOI set's shape, from its templates
    ds = mib_task(rows, tokenizer=tok, task="ioi")      # or a .jsonl / .json / .csv / .parquet file;
                                                        # tokenizer: an object, "byte" or a tokenizer folder
    ds[0]   # {"clean": (T,), "corrupt": (T,), "answer": (), "wrong": (), "position": ()}

A row of MIB's IOI set (Hugging Face `mib-bench/ioi`) holds `prompt`, `metadata` (`indirect_object`,
`subject`, `random_c`) and counterfactual prompts such as `s2_io_flip_counterfactual.prompt`;
MIB-circuit-track's `HFEAPDataset` reads the clean prompt, the counterfactual's prompt and, as the two
answer tokens, the first token of " " + indirect object and of " " + subject. `columns` maps the
four roles to dotted paths into a row (`choices.label[answerKey]` indexes by another path's value), so
another data set's names work too. Prompts are tokenized as EAP-IG's `tokenize_plus` does (a BOS
first, the EOS token where the tokenizer has no BOS, as TransformerLens' `set_tokenizer` makes it; padded
on the right); `position` is each item's last real token, where MIB's logit difference
is read (give it as `metric.position: position`).

Rows are kept as MIB's `HFEAPDataset.filter_dataset` keeps them, then the first `limit` of those (its
`num_examples`, `head(n)` after the filter), in the file's order: IOI rows whose " " + indirect object, " " +
subject and " " + `metadata.random_c` are of one token count; arithmetic rows whose answer and counterfactual
answer are one token each, whose counterfactual and its prompt are not null and whose `operator` is the task's
("+", or "-" for `arithmetic_subtraction`; plain `arithmetic` is addition, as in MIB); MCQA and ARC rows whose
two answer labels are of one token count. Then rows whose clean and counterfactual prompts still differ in token
count are left out (EAP-IG's EAP-IG-inputs refuses such a batch). `ds.dropped` counts the rows left out.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from hookrun.data.mib_ioi import NAMES, OBJECTS, PLACES, TEMPLATES
from hookrun.errors import ConfigError

ROLES = ("clean", "corrupt", "answer", "wrong")
TASKS: dict[str, dict[str, Any]] = {  # MIB-circuit-track's dataset.py, per task
    "ioi": {"clean": "prompt", "corrupt": "s2_io_flip_counterfactual.prompt", "answer": "metadata.indirect_object",
            "wrong": "metadata.subject", "space": True},
    "arithmetic": {"clean": "prompt", "corrupt": "random_counterfactual.prompt", "answer": "label",
                   "wrong": "random_counterfactual.label", "space": False},
    "mcqa": {"clean": "prompt", "corrupt": "symbol_counterfactual.prompt", "answer": "choices.label[answerKey]",
             "wrong": "symbol_counterfactual.choices.label[symbol_counterfactual.answerKey]", "space": False},
}
TASKS["arc"] = TASKS["mcqa"]
# MIB's task names (run_attribution.py's --tasks, `-` or `_`): the same columns, the filter by each's name below
for _name, _base in (("arithmetic_addition", "arithmetic"), ("arithmetic_subtraction", "arithmetic"),
                     ("arc_easy", "mcqa"), ("arc_challenge", "mcqa")):
    TASKS[_name] = TASKS[_name.replace("_", "-")] = TASKS[_base]


class MIBTask(Dataset):
    def __init__(self, items: list[dict[str, torch.Tensor]], tokenizer: Any, dropped: int) -> None:
        self.items, self.tokenizer, self.dropped = items, tokenizer, dropped

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def mib_task(rows: str | Path | Sequence[Mapping], tokenizer: Any, task: str = "ioi",
             columns: Mapping[str, str] | None = None, answer_space: bool | None = None,
             limit: int | None = None) -> MIBTask:
    """Patching items from MIB task rows (module docstring); `columns` overrides the task's paths."""
    if task not in TASKS and columns is None:
        raise ConfigError(f"data.dataset.task={task!r}; choose from: {', '.join(k for k in TASKS if '-' not in k)}, or give columns "
                          f"{{clean, corrupt, answer, wrong}} (dotted paths into a row)")
    spec = {**TASKS.get(task, {"space": False}), **dict(columns or {})}
    missing = [r for r in ROLES if r not in spec]
    if missing:
        raise ConfigError(f"data.dataset.columns: no path for {', '.join(missing)}; give each of {', '.join(ROLES)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"data.dataset.limit={limit!r}; give a whole number of rows of at least 1 (MIB's num_examples), "
                          f"or null for every row")  # (-5 left out the last 5 rows, 0 kept every row)
    space = spec["space"] if answer_space is None else answer_space
    if isinstance(tokenizer, str | Path):  # (from a config: byte, or a tokenizer folder, as data=text takes it)
        from hookrun.data.text import load_tokenizer

        tokenizer = load_tokenizer(str(tokenizer), "right")
    table = read_rows(rows) if isinstance(rows, str | Path) else list(rows)
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:  # (Qwen2.5's has none: MIB's TransformerLens sets bos_token = eos_token and prepends that)
        bos = getattr(tokenizer, "eos_token_id", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)
    answer_ids = _memo(tokenizer)  # (the answers, few and repeated: each text tokenized once, for the filter and the item)
    kept = [(i, row) for i, row in enumerate(table) if mib_keeps(task, row, spec, answer_ids, space, i)][:limit]
    pairs, answers, dropped = [], [], len(table) - len(kept)
    if not kept:
        raise ConfigError(f"data.dataset: none of the {len(table)} rows passes MIB's filter for task {task!r} "
                          f"({FILTERS.get(_kind(task), 'answers of one token count')})")
    for i, row in kept:
        clean, corrupt = (([bos] if bos is not None else []) + _ids(tokenizer, str(value(row, spec[k], i, k)))
                          for k in ("clean", "corrupt"))
        if len(clean) != len(corrupt):
            dropped += 1
            continue
        pairs.append((clean, corrupt))
        answers.append([answer_ids((" " if space else "") + str(value(row, spec[k], i, k)))[0] for k in ("answer", "wrong")])
    if not pairs:
        raise ConfigError(f"data.dataset: none of the {len(kept)} rows MIB's filter keeps has clean and counterfactual "
                          f"prompts of one token count")
    width = max(len(c) for c, _ in pairs)
    items = [{"clean": torch.tensor(c + [pad] * (width - len(c))), "corrupt": torch.tensor(k + [pad] * (width - len(k))),
              "answer": torch.tensor(a), "wrong": torch.tensor(w), "position": torch.tensor(len(c) - 1)}
             for (c, k), (a, w) in zip(pairs, answers, strict=True)]
    return MIBTask(items, tokenizer, dropped)


FILTERS = {"ioi": "' ' + indirect object, subject and metadata.random_c of one token count",
           "arithmetic": "both answers one token, a counterfactual prompt, the task's operator",
           "mcqa": "the two answer labels of one token count"}


def _kind(task: str) -> str:
    return "arithmetic" if task.startswith("arithmetic") else "mcqa" if task.startswith(("mcqa", "arc")) else task


def mib_keeps(task: str, row: Mapping, spec: Mapping, encode: Any, space: bool, i: int) -> bool:
    """Whether MIB's HFEAPDataset.filter_dataset keeps the row (MIB_circuit_track/dataset.py): by the token counts
    of the answers (" " + name for IOI, with metadata.random_c; arithmetic's each one token) and, for arithmetic, a
    counterfactual that is not null and the task's operator. Other tasks (a `columns` mapping): every row. `encode(text)`:
    the text's token ids (no special tokens)."""
    kind = _kind(task)
    if kind not in FILTERS:
        return True

    def count(path: str, role: str) -> int:
        return len(encode((" " if space else "") + str(value(row, path, i, role))))
    if kind == "arithmetic":
        if value(row, spec["corrupt"], i, "corrupt", nullable=True) is None:  # (MIB drops a null counterfactual)
            return False
        if "operator" in row and row["operator"] != ("-" if "subtraction" in task else "+"):
            return False
        return count(spec["answer"], "answer") == 1 and count(spec["wrong"], "wrong") == 1
    counts = {count(spec["answer"], "answer"), count(spec["wrong"], "wrong")}
    if kind == "ioi" and (row.get("metadata") or {}).get("random_c") is not None:  # (checked where the row has one)
        counts.add(count("metadata.random_c", "random_c"))
    return len(counts) == 1


def value(row: Mapping, path: str, i: int = 0, role: str = "", nullable: bool = False) -> Any:
    """`a.b[c.d]`: row["a"]["b"][row["c"]["d"]]; a missing key is one ConfigError naming the row. `nullable`: None
    where a part on the way is null (MIB's filter drops an arithmetic row whose counterfactual is null), where the
    path's key is missing still the ConfigError (it had every row dropped as failing MIB's filter)."""
    node: Any = row
    for part in re.findall(r"[^.\[\]]+(?:\[[^\]]+\])?", path):
        if node is None and nullable:
            return None
        name, _, index = part.partition("[")
        try:
            node = node[name]
            if index:
                node = node[value(row, index[:-1], i, role)]
        except (KeyError, IndexError, TypeError):
            keys = ", ".join(map(str, node)) if isinstance(node, Mapping) else type(node).__name__
            raise ConfigError(f"data.dataset.columns.{role}={path!r}: row {i} has no {part!r} (there: {keys})") from None
    return node


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a .jsonl, .json (a list, or JSON lines as Hugging Face's `Dataset.to_json` writes them), .csv or
    .parquet file, as MIB's data sets are published. A parquet file's rows keep their Python values (pyarrow's
    `to_pylist`, as `datasets` reads them): pandas turned a struct's integer field with a null row into floats, so
    an arithmetic counterfactual's label 55 was read as "55.0"."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"data.dataset.rows={str(path)!r}: no such file")
    if p.suffix in (".jsonl", ".json"):
        return _json_rows(p, str(path))
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    if p.suffix == ".csv":
        import pandas as pd

        return pd.read_csv(p).to_dict("records")
    raise ConfigError(f"data.dataset.rows={str(path)!r}: give a .jsonl, .json, .csv or .parquet file")


def _json_rows(p: Path, given: str) -> list[dict]:
    """A .json file's list (or its JSON lines), a .jsonl file's lines; a line that is not JSON is one ConfigError."""
    text = p.read_text()
    if p.suffix == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None  # (JSON lines in a .json file: Hugging Face's Dataset.to_json writes them)
        if isinstance(doc, list):
            return doc
        if doc is not None and not (isinstance(doc, dict) and len(text.strip().splitlines()) == 1):
            keys = f" (keys: {', '.join(map(str, list(doc)[:5]))})" if isinstance(doc, dict) else ""
            raise ConfigError(f"data.dataset.rows={given!r}: holds a JSON {type(doc).__name__}{keys}, not a list of rows; "
                              f"give a JSON list of rows or one JSON row per line")
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"data.dataset.rows={given!r}: line {n} is not JSON ({exc.msg}, column {exc.colno}); "
                                  f"give a JSON list of rows or one JSON row per line") from None
    return rows


def _memo(tokenizer: Any) -> Any:
    """_ids(tokenizer, text), each text tokenized once."""
    cache: dict[str, list[int]] = {}

    def encode(text: str) -> list[int]:
        if text not in cache:
            cache[text] = _ids(tokenizer, text)
        return cache[text]
    return encode


def _ids(tokenizer: Any, text: str) -> list[int]:
    try:
        ids = list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:  # hookrun's ByteTokenizer: encode(text), a BOS first
        ids = list(tokenizer.encode(text))
        if ids and ids[0] == getattr(tokenizer, "bos_token_id", None):
            ids = ids[1:]
    return ids


def ioi_rows(n: int = 8, seed: int = 0, names: Sequence[str] = NAMES) -> list[dict]:
    """`n` rows shaped as MIB's IOI set's, from MIB's own templates and word lists (hookrun/data/mib_ioi.py),
    drawn as its causal model draws them: a template, two distinct names A and B, the subject S (the template's
    name_C) one of them and the indirect object IO the other, a place and an object. The row holds `prompt`,
    `template`, `metadata` {indirect_object, subject, random_c (a third name), place, object} and
    `s2_io_flip_counterfactual` {prompt}: S's second mention replaced by IO, as MIB's counterfactual is."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, c = rng.sample(list(names), 3)
        s = rng.choice((a, b))
        io = b if s == a else a
        t, place, obj = rng.choice(TEMPLATES), rng.choice(PLACES), rng.choice(OBJECTS)
        fill = {"name_A": a, "name_B": b, "place": place, "object": obj}
        rows.append({"prompt": t.format(name_C=s, **fill), "template": t,
                     "metadata": {"indirect_object": io, "subject": s, "random_c": c, "place": place, "object": obj},
                     "s2_io_flip_counterfactual": {"prompt": t.format(name_C=io, **fill)}})
    return rows
