"""A file run's position labels (the grids' `position` axis: plot, report, run.grid): `p:TEXT`, each
token's text as the data set's own tokenizer decodes it (called here directly, whitespace shown as
signs here), or `[p]` where the items' tokens differ. The BOS decoded to '' and a space to ' ': the
axis had blank ticks and positions that could not be told apart. Both tokenizers a run meets: the
shipped byte tokenizer (word_swap on tiny_lm) and a transformers tokenizer (mib_task); a file
written before the labels were `p:TEXT` reads the same way; token text is never markup in the report."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import h5py
import pytest
import torch

import hookrun

pytest.importorskip("transformers")
SHOWN = {" ": "␣", "\n": "↵", "\t": "⇥"}


def shown(text: str) -> str:
    return "".join(SHOWN.get(c, c) for c in text)


def test_labels_are_text_only_where_every_items_token_agrees():
    """A cell is the mean over the items: the axis showed item 0's text where the items' tokens differ.
    Now `p:text` where all agree (each byte decoded here, not by the tokenizer), else "[p]"."""
    from hookrun.data.swaps import word_swap
    from hookrun.runner.kinds.patching.kind import token_labels

    d = word_swap(n=4, length=24)
    ids = torch.stack([d[i]["clean"] for i in range(4)])
    raw = [[bytes([t - 3]).decode() if t >= 3 else None for t in row] for row in ids.tolist()]
    want = [f"{p}:{shown(raw[0][p])}" if all(r[p] == raw[0][p] for r in raw) else f"[{p}]" for p in range(1, ids.shape[1])]
    assert token_labels(d, ids)[1:] == want and any(w.startswith("[") for w in want)  # (position 0: the BOS)
    assert token_labels(d, ids[:1])[1:] == [f"{p}:{shown(t)}" for p, t in enumerate(raw[0]) if p]  # one item: its own text


def byte_run(tmp_path):
    cfg = hookrun.compose("experiment=patching_grid", "data.dataset.n=3", "data.dataset.length=10", "progress=false",
                          f"output.path={tmp_path / 'c.h5'}")
    return hookrun.run(cfg).path


def test_byte_tokens_bos_and_space_are_visible_and_distinct(tmp_path):
    from hookrun.analysis.report.plotly_figures import to_plotly
    from hookrun.data.swaps import word_swap
    from hookrun.runner.kinds.patching.report import grid_specs

    run = hookrun.open_run(byte_run(tmp_path))
    got = [str(v) for v in run.grid("resid").coords["position"].values]
    d = word_swap(n=3, length=10)
    tok, ids = d.tokenizer, torch.stack([d[i]["clean"] for i in range(3)])
    want = []
    for p, t in enumerate(ids[0].tolist()):
        text = tok.decode([t])  # the tokenizer's own text of the id: '' for the BOS
        want.append(f"{p}:{'<bos>' if t == tok.bos_token_id else shown(text)}" if (ids[:, p] == t).all() else f"[{p}]")
    assert got == want and want[0] == "0:<bos>" and any(w.endswith(":␣") for w in want)  # a BOS and a space, shown
    assert len(set(got)) == len(got) and all(s.strip() for s in got)
    heat = next(specs[0] for name, _, specs in grid_specs(run) if name == "resid")
    assert heat.x == want
    ticks = to_plotly(heat)["layout"]["xaxis"]["ticktext"]
    assert ticks[0] == "0:&lt;bos&gt;" and not any("<" in t for t in ticks)  # plotly draws <b>, <br>: escaped
    run.close()


def hf_tokenizer():
    """A GPT-2-like tokenizer: whole words, byte-level decoding (Ġ is a space, Ċ a newline), a BOS."""
    tokenizers = pytest.importorskip("tokenizers")
    import transformers

    words = ["[PAD]", "<s>", "[UNK]", "the", "<b>", "Ġ", "Ġcat", "Ġdog", "Ċ", "sat", "x", "y"]
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    core.decoder = tokenizers.decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", bos_token="<s>", unk_token="[UNK]")


def test_a_transformers_tokenizers_labels_are_its_decode_and_never_markup(tmp_path):
    from hookrun.analysis.report.page import render
    from hookrun.data.mib import mib_task
    from hookrun.models.tiny_lm import tiny_lm

    tok = hf_tokenizer()
    rows = [{"text": "the <b> Ġ Ġcat Ċ sat", "cf": {"text": "the <b> Ġ Ġdog Ċ sat"}, "good": "x", "bad": "y"},
            {"text": "the <b> Ġ Ġdog Ċ sat", "cf": {"text": "the <b> Ġ Ġcat Ċ sat"}, "good": "y", "bad": "x"}]
    ds = mib_task(rows, tok, columns={"clean": "text", "corrupt": "cf.text", "answer": "good", "wrong": "bad"}, answer_space=False)
    cfg = hookrun.compose("experiment=patching_grid", "progress=false", f"output.path={tmp_path / 'c.h5'}",
                          "patching.metric.position=position")
    run = hookrun.open_run(hookrun.run(cfg, model=tiny_lm(), dataset=ds).path)
    ids = torch.stack([ds[i]["clean"] for i in range(len(ds))])
    want = [f"{p}:{shown(tok.decode([t]))}" if (ids[:, p] == t).all() else f"[{p}]" for p, t in enumerate(ids[0].tolist())]
    got = [str(v) for v in run.grid("resid").coords["position"].values]
    assert got == want == ["0:<s>", "1:the", "2:<b>", "3:␣", "[4]", "5:↵", "6:sat"]

    grids = [f["figure"] for s in run.report().data["sections"] for it in s.get("items", []) for f in it.get("figures", [])
             if f["figure"]["layout"]["xaxis"]["title"]["text"] == "position"]
    assert len(grids) == 3  # resid, attn, mlp: each axis as text, plotly's markup escaped
    assert all(g["layout"]["xaxis"]["ticktext"] == [w.replace("<", "&lt;").replace(">", "&gt;") for w in want] for g in grids)

    class Tags(HTMLParser):  # what a browser's parser sees: the page's own elements, no token's <b>
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[str] = []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)

    parser = Tags()
    parser.feed(render(run.report().data))
    assert "b" not in parser.tags and "s" not in parser.tags
    run.close()


def test_a_file_written_with_bare_token_text_reads_with_visible_labels(tmp_path):
    """Before, the file held each label as the bare decode ('' for the BOS, ' ' for a space): read
    now, each is `p:TEXT` too (the BOS, whose name the file does not hold, `<empty>`)."""
    from hookrun.data.swaps import word_swap

    path = byte_run(tmp_path)
    d = word_swap(n=3, length=10)
    ids = torch.stack([d[i]["clean"] for i in range(3)])
    old = [d.tokenizer.decode([t]) if (ids[:, p] == t).all() else f"[{p}]" for p, t in enumerate(ids[0].tolist())]
    with h5py.File(path, "r+") as f:  # as the code before wrote it
        meta = json.loads(f.attrs["patching"])
        meta["labels"] = old
        f.attrs["patching"] = json.dumps(meta)
    assert old[0] == "" and " " in old
    run = hookrun.open_run(path)
    got = [str(v) for v in run.grid("resid").coords["position"].values]
    assert got == ["0:<empty>", *(s if s.startswith("[") else f"{p}:{shown(s)}" for p, s in enumerate(old) if p)]
    assert len(set(got)) == len(got) and all(s.strip() for s in got)
    run.close()
