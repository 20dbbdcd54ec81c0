"""mib_task reads MIB's rows from the files Hugging Face's `datasets` writes, as `datasets` reads them back: the
reference is MIB-circuit-track's own HFEAPDataset (tests/helpers/mib_dataset.py, verbatim) over
`datasets.load_dataset` of the same file.

A parquet file (how the Hub stores MIB's sets) was read through pandas, which turns a struct's integer field
into floats where a row's struct is null: arithmetic rows whose random_counterfactual is null (rows MIB drops)
made every counterfactual label 55.0, read as the token of "55.0" (here [UNK], one token, so kept with the
wrong answer [UNK]; 8 items where MIB has 4). A .json file that `Dataset.to_json` wrote (JSON lines) ended in
json's 'JSONDecodeError: Extra data' traceback."""

from __future__ import annotations

import datasets
import mib_dataset
import pytest
from test_mib_filter import arithmetic_rows, same, wordpiece

from hookrun.data.mib import ioi_rows, mib_task
from hookrun.errors import ConfigError


def mib_from_file(path, kind, tok, task, monkeypatch):
    """MIB's dataset over the rows `datasets` reads from `path`."""
    monkeypatch.setattr(mib_dataset, "load_dataset",
                        lambda *a, **k: datasets.load_dataset(kind, data_files=str(path), split="train"))
    ds = mib_dataset.HFEAPDataset("rows", tok, split="train", task=task)
    return [ds[i] for i in range(len(ds))]


@pytest.fixture(scope="module")
def numbers_tok(tmp_path_factory):
    numbers = {str(x) for x in range(-99, 200)}
    return wordpiece(numbers | {"+", "-", "="}, {x for x in numbers if len(x.lstrip("-")) == 3 or x.startswith("-")},
                     tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("task", ["arithmetic", "arithmetic_subtraction"])
def test_parquet_rows_with_null_counterfactuals_are_mibs(tmp_path, monkeypatch, numbers_tok, task):
    rows = arithmetic_rows()
    assert any(r["random_counterfactual"] is None for r in rows)
    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "rows.parquet")
    want = mib_from_file(tmp_path / "rows.parquet", "parquet", numbers_tok, task, monkeypatch)
    items = mib_task(tmp_path / "rows.parquet", numbers_tok, task=task)
    same(items, want, numbers_tok)
    assert items.dropped == len(rows) - len(want)


@pytest.mark.parametrize("name", ["rows.json", "rows.jsonl"])
def test_json_lines_written_by_datasets_are_read(tmp_path, monkeypatch, numbers_tok, name):
    rows = arithmetic_rows(seed=3)
    datasets.Dataset.from_list(rows).to_json(tmp_path / name)  # (JSON lines, whatever the suffix)
    want = mib_from_file(tmp_path / name, "json", numbers_tok, "arithmetic", monkeypatch)
    same(mib_task(tmp_path / name, numbers_tok, task="arithmetic"), want, numbers_tok)


def test_a_json_list_and_a_broken_file_are_read_or_named(tmp_path, monkeypatch):
    import json

    from hookrun.data.text import ByteTokenizer

    rows = ioi_rows(n=6, seed=1)
    (tmp_path / "list.json").write_text(json.dumps(rows, indent=1))
    assert len(mib_task(tmp_path / "list.json", ByteTokenizer(), task="ioi").items) > 0
    (tmp_path / "obj.json").write_text(json.dumps({"train": rows}, indent=1))
    with pytest.raises(ConfigError, match=r"obj.json'?: holds a JSON dict \(keys: train\), not a list of rows"):
        mib_task(tmp_path / "obj.json", ByteTokenizer(), task="ioi")
    (tmp_path / "bad.jsonl").write_text(json.dumps(rows[0]) + "\n{\"prompt\": \n")
    with pytest.raises(ConfigError, match=r"bad.jsonl'?: line 2 is not JSON \(Expecting value, column 12\)"):
        mib_task(tmp_path / "bad.jsonl", ByteTokenizer(), task="ioi")
