"""IOI rows from MIB's own templates (hookrun/data/mib_ioi.py, hookrun/data/mib.py's ioi_rows).

The word lists are checked against facts of their source (atticusg/CausalAbstraction tasks/IOI_task, MIB's
causal variable track): their sizes and first entries. Each generated row is parsed back here with a regular
expression made from its template (independent of str.format): the subject's second mention is name_C, the
counterfactual is the same sentence with that one slot set to the indirect object (MIB's
s2_io_flip_counterfactual), and, through a word-level tokenizer built here, the items' two answer tokens
are the IO and S names."""

from __future__ import annotations

import re

import pytest

from hookrun.data.mib import ioi_rows, mib_task
from hookrun.data.mib_ioi import NAMES, OBJECTS, PLACES, TEMPLATES


def test_the_word_lists_are_mibs():
    assert (len(TEMPLATES), len(NAMES), len(OBJECTS), len(PLACES)) == (70, 99, 8, 8)
    assert TEMPLATES[0] == "After the lunch, {name_A} and {name_B} went to the {place}. {name_C} gave a {object} to"
    assert NAMES[:4] == ("Michael", "Christopher", "Jessica", "Matthew") and NAMES[-1] == "Samuel"
    assert OBJECTS[:3] == ("ring", "kiss", "bone") and PLACES[:3] == ("store", "garden", "restaurant")
    assert all(t.count("{name_A}") == t.count("{name_B}") == t.count("{name_C}") == 1 for t in TEMPLATES)


def parse(template: str, prompt: str) -> dict:
    pattern = re.escape(template)
    for slot in ("name_A", "name_B", "name_C", "place", "object"):
        at = re.escape("{" + slot + "}")
        pattern = pattern.replace(at, f"(?P<{slot}>[A-Za-z]+)", 1).replace(at, f"(?P={slot})")  # a slot twice: the same word
    match = re.fullmatch(pattern, prompt)
    assert match is not None, (template, prompt)
    return match.groupdict()


def test_rows_follow_mibs_templates_and_counterfactual():
    rows = ioi_rows(n=60, seed=3)
    assert len({r["template"] for r in rows}) > 20
    for r in rows:
        assert r["template"] in TEMPLATES
        meta, clean = r["metadata"], parse(r["template"], r["prompt"])
        cf = parse(r["template"], r["s2_io_flip_counterfactual"]["prompt"])
        io, s = meta["indirect_object"], meta["subject"]
        assert {clean["name_A"], clean["name_B"]} == {io, s} and io != s
        assert clean["name_C"] == s and cf["name_C"] == io  # S2 flipped to the IO, nothing else changed
        assert {k: v for k, v in cf.items() if k != "name_C"} == {k: v for k, v in clean.items() if k != "name_C"}
        assert clean.get("place", meta["place"]) == meta["place"] and clean.get("object", meta["object"]) == meta["object"]
        assert {io, s, meta["random_c"]} <= set(NAMES) and meta["random_c"] not in (io, s)
        assert meta["place"] in PLACES and meta["object"] in OBJECTS


def test_the_items_answer_tokens_are_the_io_and_s_names():
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    rows = ioi_rows(n=12, seed=5)
    words = sorted({w for r in rows for p in (r["prompt"], r["s2_io_flip_counterfactual"]["prompt"])
                    for w in re.findall(r"\w+|[^\w\s]", p)})
    vocab = {"[UNK]": 0, "<bos>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", unk_token="[UNK]")
    ds = mib_task(rows, tok, task="ioi")
    assert len(ds) == len(rows) and ds.dropped == 0  # one token a word: clean and counterfactual of one length
    for item, r in zip(ds, rows, strict=True):
        io, s = r["metadata"]["indirect_object"], r["metadata"]["subject"]
        assert (int(item["answer"]), int(item["wrong"])) == (vocab[io], vocab[s])
        clean = [1] + [vocab[w] for w in re.findall(r"\w+|[^\w\s]", r["prompt"])]
        assert item["clean"][: len(clean)].tolist() == clean and int(item["position"]) == len(clean) - 1
        differ = (item["clean"] != item["corrupt"]).nonzero().view(-1).tolist()
        assert len(differ) == 1 and int(item["clean"][differ[0]]) == vocab[s] and int(item["corrupt"][differ[0]]) == vocab[io]
