"""mib_task keeps the rows MIB keeps, in its order: the reference is MIB-circuit-track's own HFEAPDataset
(tests/helpers/mib_dataset.py, verbatim), fed the same rows in place of its Hugging Face download.

MIB's filter_dataset keeps IOI rows whose " " + indirect object, subject and metadata.random_c are of one
token count; arithmetic rows whose two answers are one token each, with a counterfactual and the task's
operator; MCQA / ARC rows whose two answer labels are of one token count; then `num_examples` takes the first
n kept. hookrun dropped only rows whose two prompts differed in token count, and took `limit` rows before
that: on the IOI rows below, with a tokenizer that splits every third name in two, MIB kept 12 rows of 40 and
hookrun 21 (its 6 with limit=10 were not MIB's first 6); arithmetic answers of two tokens were read by their first,
and a null counterfactual (which MIB drops) stopped mib_task with a ConfigError."""

from __future__ import annotations

import random

import datasets
import mib_dataset
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hookrun.data.mib import ioi_rows, mib_task
from hookrun.data.mib_ioi import NAMES
from hookrun.errors import ConfigError


def wordpiece(words, split, folder):
    """A word-level tokenizer (a BOS, whitespace split) where each word in `split` is two pieces."""
    vocab = {"<bos>": 0, "[UNK]": 1}
    for w in sorted(words):
        for piece in ([w[:1], "##" + w[1:]] if w in split else [w]):
            vocab.setdefault(piece, len(vocab))
    wp = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=wp, bos_token="<bos>", eos_token="<bos>", unk_token="[UNK]").save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)


def mib(rows, tok, task, n, monkeypatch):
    """MIB's dataset over `rows`: (clean prompt, counterfactual prompt, [answer id, wrong id]) per kept row."""
    monkeypatch.setattr(mib_dataset, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
    ds = mib_dataset.HFEAPDataset("rows", tok, split="train", task=task, num_examples=n)
    return [ds[i] for i in range(len(ds))]


def same(items, want, tok):
    assert len(items) == len(want) > 0
    for item, (clean, cf, (a, w)) in zip(items, want, strict=True):
        p = int(item["position"]) + 1
        for key, prompt in (("clean", clean), ("corrupt", cf)):
            assert item[key].tolist()[:p] == [tok.bos_token_id] + tok(prompt, add_special_tokens=False).input_ids, key
        assert (int(item["answer"]), int(item["wrong"])) == (a, w)


@pytest.mark.parametrize("n", [None, 10])
def test_ioi_rows_kept_are_mibs(tmp_path, monkeypatch, n):
    rows = ioi_rows(n=40, seed=2)
    words = {w for r in rows for t in (r["prompt"], r["s2_io_flip_counterfactual"]["prompt"]) for w in t.split()} | set(NAMES)
    tok = wordpiece(words, set(NAMES[::3]), tmp_path)
    want = mib(rows, tok, "ioi", n, monkeypatch)
    items = mib_task(rows, tok, task="ioi", limit=n)
    same(items, want, tok)
    assert items.dropped == 40 - len(want)


def arithmetic_rows(n=40, seed=0):
    rng, rows = random.Random(seed), []
    for _ in range(n):
        op = rng.choice("+-")
        a, b, c, d = (rng.randint(1, 99) for _ in range(4))
        label, cf = (a + b, c + d) if op == "+" else (a - b, c - d)
        counterfactual = None if rng.random() < 0.15 else {"prompt": f"{c} {op} {d} =", "label": cf}
        rows.append({"prompt": f"{a} {op} {b} =", "label": label, "operator": op, "random_counterfactual": counterfactual})
    return rows


@pytest.mark.parametrize("task", ["arithmetic_addition", "arithmetic-subtraction", "arithmetic"])
def test_arithmetic_rows_kept_are_mibs(tmp_path, monkeypatch, task):
    rows = arithmetic_rows()
    numbers = {str(x) for x in range(-99, 200)}
    tok = wordpiece(numbers | {"+", "-", "="}, {x for x in numbers if len(x.lstrip("-")) == 3 or x.startswith("-")}, tmp_path)
    want = mib(rows, tok, task, None, monkeypatch)
    same(mib_task(rows, tok, task=task), want, tok)


def test_mcqa_rows_kept_are_mibs(tmp_path, monkeypatch):
    rng, rows = random.Random(1), []
    labels = ["A", "B", "C", "D", "Alpha", "Beta"]
    for i in range(30):
        ls, cs = rng.sample(labels, 4), rng.sample(labels, 4)
        rows.append({"prompt": f"question {i} answer:", "choices": {"label": ls}, "answerKey": rng.randrange(4),
                     "symbol_counterfactual": {"prompt": f"question {i} reply:", "choices": {"label": cs},
                                               "answerKey": rng.randrange(4)}})
    words = set(labels) | {"question", "answer:", "reply:"} | {str(i) for i in range(30)}
    tok = wordpiece(words, {"Alpha", "Beta"}, tmp_path)
    want = mib(rows, tok, "mcqa", None, monkeypatch)
    same(mib_task(rows, tok, task="mcqa"), want, tok)
    assert len(want) < len(rows)


def test_no_row_passing_the_filter_is_one_line(tmp_path):
    rows = [r for r in arithmetic_rows() if r["operator"] == "-"]
    tok = wordpiece({str(x) for x in range(-99, 200)} | {"+", "-", "="}, set(), tmp_path)
    with pytest.raises(ConfigError, match=r"^data.dataset: none of the \d+ rows passes MIB's filter for task 'arithmetic' "
                                          r"\(both answers one token, a counterfactual prompt, the task's operator\)"):
        mib_task(rows, tok, task="arithmetic")


def test_each_answer_text_is_tokenized_once(tmp_path, monkeypatch):
    """The filter's token counts and the items' answer tokens come from one encoding of each text (the filter and
    the item each tokenized every answer: 4.3 encodes per row, 0.97 s for 5,000 IOI rows, now 0.67 and 0.21 s);
    the items are still MIB's."""
    from collections import Counter

    rows = ioi_rows(n=60, seed=4)
    words = {w for r in rows for t in (r["prompt"], r["s2_io_flip_counterfactual"]["prompt"]) for w in t.split()} | set(NAMES)
    tok = wordpiece(words, set(NAMES[::3]), tmp_path)
    want = mib(rows, tok, "ioi", None, monkeypatch)
    calls: Counter = Counter()
    real = type(tok).encode
    monkeypatch.setattr(type(tok), "encode", lambda self, text, *a, **k: calls.update([text]) or real(self, text, *a, **k))
    same(mib_task(rows, tok, task="ioi"), want, tok)
    assert calls and max(calls.values()) == 1, calls.most_common(3)


@pytest.mark.parametrize(("corrupt", "line"), [
    ("random_counterfactul.prompt", "row 0 has no 'random_counterfactul' (there: prompt, label, operator, "
                                    "random_counterfactual)"),
    ("random_counterfactual.promt", "row 0 has no 'promt' (there: prompt, label)"),
])
def test_a_counterfactual_path_rows_lack_is_named_not_filtered(tmp_path, corrupt, line):
    """A path whose key the rows lack (a typo) had every row dropped as failing MIB's filter ('none of the 40 rows
    passes MIB's filter'); MIB's own filter reads x["random_counterfactual"]["prompt"] and fails on such a key.
    A null counterfactual (MIB drops the row) is still dropped: test_arithmetic_rows_kept_are_mibs."""
    rows = arithmetic_rows()
    tok = wordpiece({str(x) for x in range(-99, 200)} | {"+", "-", "="}, set(), tmp_path)
    columns = {"clean": "prompt", "corrupt": corrupt, "answer": "label", "wrong": "random_counterfactual.label"}
    with pytest.raises(ConfigError) as err:
        mib_task(rows, tok, task="arithmetic", columns=columns)
    assert str(err.value) == f"data.dataset.columns.corrupt={corrupt!r}: {line}"


@pytest.mark.parametrize("limit", [-5, 0, 2.5, True, "10"])
def test_a_limit_that_is_not_a_count_of_rows_is_one_line(tmp_path, limit):
    """limit=-5 kept all but the last 5 of MIB's rows (a Python slice) and limit=0 kept every row, without a word."""
    from hookrun.data.text import ByteTokenizer

    with pytest.raises(ConfigError, match=r"^data.dataset.limit=.*; give a whole number of rows of at least 1"):
        mib_task(ioi_rows(n=8, seed=0), ByteTokenizer(), task="ioi", answer_space=False, limit=limit)
