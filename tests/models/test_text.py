"""data=text: .txt, .jsonl, datasets folders, the byte tokenizer and a local tokenizer folder."""

from __future__ import annotations

import json
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download

import pytest
import torch

from hookrun.data import ByteTokenizer, text
from hookrun.errors import ConfigError


def test_byte_tokenizer_round_trip_and_padding_sides():
    tok = ByteTokenizer()
    ids = tok.encode("héllo")
    assert ids[0] == tok.bos_token_id and tok.decode(ids) == "héllo" and tok.vocab_size == 259
    right = ByteTokenizer(padding_side="right")(["ab", "abcd"], max_length=6)
    left = ByteTokenizer(padding_side="left")(["ab", "abcd"], max_length=6)
    assert right["input_ids"][0].tolist() == [1, 100, 101, 0, 0, 0] and right["attention_mask"][0].tolist() == [1, 1, 1, 0, 0, 0]
    assert left["input_ids"][0].tolist() == [0, 0, 0, 1, 100, 101] and left["attention_mask"][0].tolist() == [0, 0, 0, 1, 1, 1]
    assert ByteTokenizer()(["ab", "abcd"], max_length=6, padding="longest")["input_ids"].shape == (2, 5)


def test_txt_jsonl_and_datasets_folder(tmp_path):
    (tmp_path / "a.txt").write_text("first line\n\nsecond line\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "third"}) + "\n" + json.dumps({"body": "fourth"}) + "\n")
    ds = text(files=[str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")], field="body", max_length=8)
    assert ds.texts == ["first line", "second line", "third", "fourth"] and len(ds) == 4
    assert ByteTokenizer().decode(ds[2]["input_ids"]) == "third" and int(ds[2]["attention_mask"].sum()) == 6
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["alpha", "beta"]}).save_to_disk(str(tmp_path / "saved"))
    assert text(files=str(tmp_path / "saved")).texts == ["alpha", "beta"]
    with pytest.raises(ConfigError, match="data.dataset.field='body': .* has columns text"):
        text(files=str(tmp_path / "saved"), field="body")
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]}),
                                   "test": datasets.Dataset.from_dict({"text": ["b"]})})
    splits.save_to_disk(str(tmp_path / "splits"))  # (refused as 'has columns train, test': the splits, not columns)
    with pytest.raises(ConfigError) as err:
        text(files=str(tmp_path / "splits"))
    assert str(err.value) == (f"data.dataset.files: {str(tmp_path / 'splits')!r} holds the splits train, test (a DatasetDict); "
                              f"give one split's folder, e.g. {str(tmp_path / 'splits' / 'train')!r}")
    assert text(files=str(tmp_path / "splits" / "train")).texts == ["a"]


def test_a_line_ends_at_a_newline_only(tmp_path):
    """str.splitlines also splits at U+2028, U+2029, \\x0b, \\x1c..\\x1e and \\x85: a sample became two and a
    JSON line holding one was refused. Reference: json.loads of each "\\n" line."""
    odd = "one\u2028two\u2029three\x0bfour\x1cfive\x85six"
    (tmp_path / "a.txt").write_text(f"{odd}\r\nsecond\n\n", encoding="utf-8")
    assert text(files=str(tmp_path / "a.txt")).texts == [odd, "second"]
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": odd}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert text(files=str(tmp_path / "a.jsonl")).texts == [json.loads(json.dumps({"text": odd}))["text"]]
    (tmp_path / "cr.txt").write_bytes(b"two\rthree\r\nfour\n")  # a lone \r is no line end (it split a sample in two)
    assert text(files=str(tmp_path / "cr.txt")).texts == ["two\rthree", "four"]


def test_a_byte_order_mark_is_no_text(tmp_path):
    """A UTF-8 byte-order mark (Windows editors write one) became the first sample's first three tokens
    (242, 190, 194), and a .jsonl file with one was refused as 'not JSON'. Reference: the ids by hand
    (bos 1, then byte + 3); Python's own utf-8-sig codec for the texts."""
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.txt").write_bytes(bom + b"hi\r\nyo\n")
    ds = text(files=str(tmp_path / "a.txt"), max_length=4)
    assert ds.texts == ["hi", "yo"] and ds[0]["input_ids"].tolist() == [1, ord("h") + 3, ord("i") + 3, 0]
    (tmp_path / "a.jsonl").write_bytes(bom + json.dumps({"text": "hi"}).encode() + b"\n")
    assert text(files=str(tmp_path / "a.jsonl")).texts == [json.loads((bom + b'"hi"').decode("utf-8-sig"))]


def test_a_file_that_is_not_lines_of_text_is_refused_in_one_line(tmp_path):
    """A .json document, a .csv table or a .gz file was read line by line: '[{"text": "hello"},', the CSV header
    and every row became samples, silently (gzip's bytes a UnicodeDecodeError naming no file); an upper-case
    .JSONL was read as plain lines, its JSON syntax tokenized."""
    (tmp_path / "b.JSONL").write_text(json.dumps({"text": "hello"}) + "\n")
    assert text(files=str(tmp_path / "b.JSONL")).texts == ["hello"]
    for name in ("a.json", "c.csv", "d.txt.gz"):
        (tmp_path / name).write_text('[{"text": "hello"}]\n')
        with pytest.raises(ConfigError) as err:
            text(files=str(tmp_path / name))
        suffix = name[name.rindex("."):]
        assert str(err.value) == (f"data.dataset.files: {str(tmp_path / name)!r} is a {suffix} file, which is not read as text "
                                  f"lines; give a .txt file (a sample per line), a .jsonl file (a JSON object per line, its "
                                  f"data.dataset.field) or a folder saved with datasets' save_to_disk")
    (tmp_path / "e.txt").write_bytes(b"ok\n\x8b\xff\n")
    with pytest.raises(ConfigError, match=r"^data.dataset.files: '.*e.txt' is not UTF-8 text \(byte 3\); give a .txt or "
                                          r".jsonl file in UTF-8$"):
        text(files=str(tmp_path / "e.txt"))


@pytest.mark.parametrize("value", [None, ["a", "b"], 42])
def test_a_value_that_is_not_text_is_refused_naming_the_line(tmp_path, value):
    """null became the sample 'None', a list "['a', 'b']", a number '42': text the file never held."""
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": value}) + "\n")
    with pytest.raises(ConfigError, match=rf"field='text': .*a.jsonl' line 2 holds {json.dumps(value)[:2].replace('[', '.')}.*, not text"):
        text(files=str(tmp_path / "a.jsonl"))
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": [1, 2]}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(ConfigError, match=r"field='text': .*saved' row 0 holds int 1, not text"):
        text(files=str(tmp_path / "saved"))


def test_local_tokenizer_folder(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"[PAD]": 0, "[UNK]": 1, "hello": 2, "world": 3}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]")
    fast.save_pretrained(str(tmp_path / "tok"))
    (tmp_path / "t.txt").write_text("hello world\nworld\n")
    ds = text(files=str(tmp_path / "t.txt"), tokenizer=str(tmp_path / "tok"), max_length=4, padding_side="left")
    assert ds.encoded["input_ids"].tolist() == [[0, 0, 2, 3], [0, 0, 0, 3]]
    assert ds.encoded["attention_mask"].dtype == torch.long


def test_a_tokenizer_with_nothing_to_pad_with_is_one_line_whose_advice_works(tmp_path):
    """transformers' own error suggested Python code (tokenizer.pad_token = ...), which a config cannot run."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[PAD]": 0, "hello": 1, "world": 2}, unk_token="[PAD]"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=core).save_pretrained(str(tmp_path / "tok"))
    (tmp_path / "t.txt").write_text("hello world\nworld\n")
    with pytest.raises(ConfigError, match=r"tok' has no pad, eos or unk token to pad the texts with; set \"pad_token\" in its special_tokens_map.json"):
        text(files=str(tmp_path / "t.txt"), tokenizer=str(tmp_path / "tok"), max_length=3)
    (tmp_path / "tok" / "special_tokens_map.json").write_text(json.dumps({"pad_token": "[PAD]"}))
    ds = text(files=str(tmp_path / "t.txt"), tokenizer=str(tmp_path / "tok"), max_length=3, padding_side="right")
    assert ds.encoded["input_ids"].tolist() == [[1, 2, 0], [2, 0, 0]]


@pytest.mark.parametrize("kw, message", [
    ({"files": "/nope.txt"}, "data.dataset.files: no file '/nope.txt'"),
    ({"tokenizer": "/no/tok"}, "data.dataset.tokenizer: no folder '/no/tok'"),
    ({"padding": "some"}, "data.dataset.padding='some'; choose max_length or longest"),
    ({"padding_side": "up"}, "padding_side='up'; choose left or right"),
    ({"max_length": True}, "data.dataset.max_length=True; expected a whole number >= 1"),
    ({"files": []}, "data.dataset.files=[] names no file; give files (a .txt, .jsonl or datasets folder), or null for"),
])
def test_bad_text_settings(kw, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        text(**kw)
